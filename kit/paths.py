"""Where mlx-kit keeps its files (platformdirs) and where its bundled data lives.

- state dir: server pid files (``server-<port>.json``)
- log dir: server logs (``server-<port>.log``)
- data dir: the harness manifest and the starter's source cache
- cache dir: mlx's compiled CUDA kernels (``ptx/<mlx version>``), the prompt cache's
  disk tier (``prompt-cache/``)
- config dir: the user's own agents, ``harnesses/<agent>.toml`` + ``templates/<agent>/``
- bundled data: ``templates/`` and ``harnesses/``; at the repo's top level in a checkout
  (editable install), or ``kit/_data/`` inside a wheel.

Agent specs are looked up in :func:`spec_roots`: the bundled agents, then the user's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP = "mlx-kit"


def _dir(path: str, create: bool) -> Path:
    p = Path(path)
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


# Not created by default: a read-only command (`status`, `models`, `harness list/status`)
# must leave nothing in a fresh HOME. Writers pass create=True (or mkdir the subfolder
# they write into, with parents).
def state_dir(create: bool = False) -> Path:
    """Directory for pid files and launch locks; created only with ``create=True``."""
    return _dir(platformdirs.user_state_dir(APP), create)


def private_dir(path: Path) -> Path:
    """Create the directory ``path`` (and its parents) if it is missing, ``path`` itself
    with mode 0700 (only this user reads what goes in: logs hold prompts and tokens). A
    directory that already exists is left as it is: never chmod one we did not create.

    Raises:
        OSError: it cannot be created.
    """
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:  # made by someone else meanwhile: theirs, leave it
        return path
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    return path


def log_dir(create: bool = False) -> Path:
    """Directory for server and crash logs; created (0700, see :func:`private_dir`) only
    with ``create=True``."""
    p = Path(platformdirs.user_log_dir(APP))
    return private_dir(p) if create else p


def data_dir(create: bool = False) -> Path:
    """Directory for the harness manifest, backups and downloaded model sources; created
    only with ``create=True``."""
    return _dir(platformdirs.user_data_dir(APP), create)


def config_dir() -> Path:
    """mlx-kit's own config folder (platformdirs: ``$XDG_CONFIG_HOME/mlx-kit``, else
    ``~/.config/mlx-kit`` on Linux; ``~/Library/Application Support/mlx-kit`` on macOS).
    It holds the user's agents; mlx-kit only reads it, so it is never created here.
    No MLX_KIT_* variable moves it: the XDG variable already does, as for the other dirs."""
    return Path(platformdirs.user_config_dir(APP))


def kernel_cache_dir() -> Path:
    """Where mlx's CUDA build keeps the kernels it compiles on first use (its
    ``MLX_PTX_CACHE_DIR``), one folder per mlx version. mlx's default is under the temp
    dir, which many Linux systems empty at boot; a heavy kernel takes ~30 s to compile (an
    H200 run: one agent turn stalled 33 s on two of them), so they are kept here instead.
    Not created here: mlx creates it when it first compiles."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mlx = version("mlx")
    except PackageNotFoundError:
        mlx = "unknown"
    return Path(platformdirs.user_cache_dir(APP)) / "ptx" / mlx


def prompt_cache_dir() -> Path:
    """The prompt cache's disk tier by default (``serve --prompt-cache-dir`` moves it):
    KV caches of long prompt prefixes, one folder per model identity
    (:mod:`kit.engine.cache.disk_cache`). Not created here: the first write creates it."""
    return Path(platformdirs.user_cache_dir(APP)) / "prompt-cache"


def _bundled(name: str) -> Path:
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "_data" / name, pkg.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} not found next to {pkg}")


def templates_dir() -> Path:
    """The folder of Jinja templates (one subfolder per agent)."""
    return _bundled("templates")


def harnesses_dir() -> Path:
    """The folder of declarative agent specs (``<agent>.toml``)."""
    return _bundled("harnesses")


@dataclass(frozen=True)
class SpecRoot:
    """A place agent specs are loaded from: ``harnesses/*.toml`` and the templates they
    name (``template = "<agent>/x.j2"`` is ``templates / "<agent>/x.j2"``)."""

    harnesses: Path
    templates: Path
    builtin: bool  # shipped with mlx-kit (a broken one is a bug, not the user's problem)


def spec_roots() -> tuple[SpecRoot, ...]:
    """Where agents come from, in order: the bundled ones, then the user's own in
    ``<config dir>/harnesses`` with templates in ``<config dir>/templates``. Built-ins come
    first because a user spec may not reuse a built-in's name (kit.harness.spec_loader)."""
    user = config_dir()
    return (SpecRoot(harnesses_dir(), templates_dir(), True),
            SpecRoot(user / "harnesses", user / "templates", False))
