"""`mlx-kit pull` failures, told apart by huggingface_hub's typed errors: a repo that does
not exist, a gated repo, a hub that cannot be reached or answers 500. Each is one line
with a hint, never a traceback.

The Hugging Face hub cannot be reached from here, so a stand-in answers on loopback the
way the hub does (status + ``X-Error-Code`` header, which huggingface_hub turns into its
typed errors); everything else (the CLI, huggingface_hub, its HTTP client) is real."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import clean_env, free_port

REPO = "mlx-community/Qwen2.5-0.5B-Instruct-4bit"


def fake_hub(status: int, error_code: str | None):
    """A loopback HTTP server answering every request with ``status`` (+ X-Error-Code)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            self.send_response(status)
            if error_code:
                self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Type", "application/json")
            body = b'{"error": "stand-in"}'
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pull(tmp_path, endpoint: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", "pull", REPO],
                          env=clean_env(tmp_path, tmp_path / "hf", HF_ENDPOINT=endpoint, **env),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.fixture
def hub(request):
    status, code = request.param
    server = fake_hub(status, code)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("hub", [(404, "RepoNotFound")], indirect=True)
def test_pull_of_a_repo_the_hub_does_not_have_says_not_found(tmp_path, hub):
    r = pull(tmp_path, hub)
    assert r.returncode == 1
    assert f"error: model '{REPO}' not found" in r.stderr
    assert "no repo by that name on the Hugging Face hub" in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("hub", [(403, "GatedRepo")], indirect=True)
def test_pull_of_a_gated_repo_says_gated_and_how_to_get_access(tmp_path, hub):
    r = pull(tmp_path, hub)
    flat = " ".join(r.stderr.split())
    assert r.returncode == 1
    assert f"error: cannot download {REPO}: the repo is gated" in flat
    assert f"https://huggingface.co/{REPO}" in flat and "hf auth login" in flat
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("hub", [(500, None)], indirect=True)
def test_pull_when_the_hub_answers_500_names_the_status(tmp_path, hub):
    r = pull(tmp_path, hub)
    assert r.returncode == 1
    assert f"error: cannot download {REPO}: the hub answered HTTP 500" in r.stderr
    assert "Traceback" not in r.stderr


def test_pull_in_offline_mode_says_the_hub_is_not_reachable(tmp_path):
    r = pull(tmp_path, f"http://127.0.0.1:{free_port()}", HF_HUB_OFFLINE="1")
    assert r.returncode == 1
    assert f"error: cannot download {REPO}: the Hugging Face hub is not reachable" in r.stderr
    assert "HF_HUB_OFFLINE" in r.stderr and "Traceback" not in r.stderr
