"""End to end: `mlx-kit launch pi -- -p ...` with a real pi binary, a throwaway HOME and the
real starter model behind a real server process that launch starts (or reuses).

Every test runs on the newest and the oldest pi that harnesses/pi.toml says is verified:
`pi` on PATH (today's @earendil-works/pi-coding-agent, Node >= 22.19) and the pi in the
folder MLX_KIT_PI_OLDEST_BIN (the last @mariozechner/pi-coding-agent, 0.73.1), which goes
first on PATH for that run. .ci/run installs both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from kit.harness.spec_loader import load_spec
from tests.helpers import (TEST_KEY, assert_served, clean_env, free_port, generated_texts,
                           require_binary, run_kit)
from tests.e2e.warnings import assert_no_config_warnings


F32 = "mlx-kit/SmolLM2-135M-Instruct"
USER_EXTENSION = "// the user's own pi extension\nexport default function (pi) {}\n"


VERIFIED = load_spec("pi").verified


def pi_path(which: str) -> str:
    """The PATH under which `pi` is the newest or the oldest verified pi."""
    if which == "newest":
        require_binary("pi")
        return os.environ["PATH"]
    folder = os.environ.get("MLX_KIT_PI_OLDEST_BIN")
    if not folder or not (Path(folder) / "pi").is_file():
        if os.environ.get("MLX_KIT_REQUIRE_AGENTS") == "1":
            pytest.fail("MLX_KIT_PI_OLDEST_BIN does not name a folder with pi, but "
                        "MLX_KIT_REQUIRE_AGENTS=1")
        pytest.skip("MLX_KIT_PI_OLDEST_BIN (the oldest verified pi's folder) is not set")
    return folder + os.pathsep + os.environ["PATH"]


class Env:
    def __init__(self, home: Path, hf_home: Path, port: int, path: str):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        # Greedy, so answers are short and repeatable (pi sends no temperature).
        self.env = clean_env(home, hf_home, MLX_KIT_URL=self.url, MLX_KIT_LOG_LEVEL="debug",
                             MLX_KIT_TEMPERATURE="0", PATH=path)
        self.agent_dir = home / ".pi" / "agent"
        self.server_log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"

    def kit(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return run_kit(self.env, *args, cwd=self.home, timeout=timeout)

    def pi(self, *args: str, timeout: float = 120, input: str | None = None
           ) -> subprocess.CompletedProcess:
        pi = shutil.which("pi", path=self.env["PATH"])
        return subprocess.run([pi, *args], env=self.env, cwd=self.home,
                              capture_output=True, text=True, timeout=timeout, input=input)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def log_text(self) -> str:
        """The log of the server launch started (for :func:`assert_served`)."""
        return self.server_log.read_text(errors="replace")

    def extensions(self) -> dict[str, bytes]:
        folder = self.agent_dir / "extensions"
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


@pytest.fixture(scope="module", params=["newest", "oldest"])
def env(request, hf_home, tmp_path_factory):
    e = Env(tmp_path_factory.mktemp("home-pi"), hf_home, free_port(), pi_path(request.param))
    e.version = VERIFIED[1] if request.param == "newest" else VERIFIED[0]
    # The user already has pi set up: one extension of their own, retries off so a failed
    # request fails fast instead of retrying for ~20 s.
    (e.agent_dir / "extensions").mkdir(parents=True)
    (e.agent_dir / "extensions" / "user-ext.ts").write_text(USER_EXTENSION)
    (e.agent_dir / "settings.json").write_text(json.dumps({"retry": {"enabled": False}}))
    e.before = e.extensions()
    yield e
    e.kit("stop")


def test_the_pi_under_test_is_the_verified_version(env):
    r = env.pi("--version")
    assert (r.stdout + r.stderr).strip() == env.version


def test_launch_starts_the_server_and_pi_answers_through_it(env):
    r = env.kit("launch", "pi", "--", "-p", "What is the capital of France?", "--no-session")
    assert r.returncode == 0, r.stderr
    assert_no_config_warnings("pi", r.stdout, r.stderr)
    assert "started mlx-kit server" in r.stderr
    answer = r.stdout.strip()
    assert answer
    # The server saw exactly one chat request (pi's compaction did not fire a second one)
    # and generated the very text pi printed.
    assert_served(env, 0, answer)
    health = env.health()
    assert (env.agent_dir / "extensions" / "mlx-kit.ts").is_file()
    env.first_pid = health["pid"]


def test_second_launch_reuses_the_same_server_process(env):
    r = env.kit("launch", "pi", "--", "-p", "What is 2 + 2?", "--no-session")
    assert r.returncode == 0, r.stderr
    assert "reusing mlx-kit server" in r.stderr
    assert_no_config_warnings("pi", r.stdout, r.stderr)
    assert env.health()["pid"] == env.first_pid
    assert_served(env, 1, r.stdout)


def test_after_a_swap_a_new_pi_session_shows_the_new_model_under_local(env, hf_home):
    # The second model is a copy of the f32 starter in a folder of its own (its id is the
    # folder's path): the 4-bit starter's CPU prefill (~10 tok/s) would take a minute on
    # pi's ~600-token prompt. Swapping between the two real variants is tested in
    # tests/server/test_models.py.
    snap = next((hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct" / "snapshots").iterdir())
    other = env.home / "models" / "SmolLM2-copy"
    shutil.copytree(snap, other)
    r = env.kit("swap", str(other))
    assert r.returncode == 0, r.stderr
    rpc = env.pi("--mode", "rpc", "--provider", "mlx-kit", "--model", "local", "--no-session",
                 input='{"type": "get_state"}\n')
    replies = [json.loads(ln) for ln in rpc.stdout.splitlines() if ln.startswith("{")]
    state = next(m for m in replies if m.get("command") == "get_state")
    assert state["data"]["model"]["id"] == "local"
    assert state["data"]["model"]["name"] == f"local ({other})"  # the extension re-discovered
    r = env.kit("launch", "pi", "--", "-p", "What is the capital of France?", "--no-session")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert r.stdout.strip() in [t.strip() for t in generated_texts(env.server_log.read_text())]
    health = env.health()
    assert health["model"] == str(other) and health["pid"] == env.first_pid


def test_launch_with_model_swaps_the_running_server_back(env):
    r = env.kit("launch", "pi", "--model", F32, "--", "-p", "What is the capital of France?",
                "--no-session")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    health = env.health()
    assert health["model"] == F32 and health["pid"] == env.first_pid and health["swaps"] == 2


def test_pi_lists_local_with_the_real_model_name(env):
    r = env.pi("--list-models")
    assert r.returncode == 0, r.stderr
    assert_no_config_warnings("pi", r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert re.search(r"mlx-kit\s+local\b", out), out
    assert "SmolLM2-135M-Instruct" in out


def test_server_down_pi_starts_with_baked_list_and_fails_cleanly(env):
    assert "stopped" in env.kit("stop").stdout
    with pytest.raises(httpx.ConnectError):
        httpx.get(env.url + "/health", timeout=2)
    listed = env.pi("--list-models")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"mlx-kit\s+local\b", listed.stdout + listed.stderr)
    r = env.pi("--provider", "mlx-kit", "--model", "local", "-p", "hi", "--no-session")
    assert r.returncode != 0
    assert "extension" not in r.stderr.lower(), r.stderr  # it loaded; the request failed
    assert re.search(r"connect|fetch failed|ECONNREFUSED|Connection error", r.stderr, re.I), r.stderr


def test_harness_remove_leaves_the_extensions_folder_as_it_was(env):
    r = env.kit("harness", "remove", "pi")
    assert r.returncode == 0, r.stderr
    assert "mlx-kit.ts" in r.stdout
    assert env.extensions() == env.before


def test_a_server_started_with_api_key_accepts_pis_requests(env, keyed_server):
    """pi >= 0.77 sends a plain apiKey string as the key itself: the extension must hand
    pi MLX_KIT_API_KEY's value, else every request is a 401 (issue 13)."""
    server = keyed_server
    refused = '"POST /v1/chat/completions HTTP/1.1" 401'
    keyed = {**env.env, "MLX_KIT_URL": server.v1, "MLX_KIT_API_KEY": TEST_KEY}
    before = server.log_text().count('"POST /v1/chat/completions HTTP/1.1" 200')
    r = run_kit(keyed, "launch", "pi", "--", "-p", "What is the capital of France?",
                "--no-session", cwd=env.home, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_no_config_warnings("pi", r.stdout, r.stderr)
    assert r.stdout.strip() in [t.strip() for t in generated_texts(server.log_text())]
    assert server.log_text().count('"POST /v1/chat/completions HTTP/1.1" 200') > before
    # The same extension without the key in the environment: the server says 401
    # (launch itself refuses first, so pi is run directly).
    no_key = {k: v for k, v in keyed.items() if k != "MLX_KIT_API_KEY"}
    was_refused = server.log_text().count(refused)
    r = subprocess.run([shutil.which("pi", path=env.env["PATH"]), "--provider", "mlx-kit",
                        "--model", "local", "-p", "hi", "--no-session"], env=no_key,
                       cwd=env.home, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "401" in r.stdout + r.stderr
    assert server.log_text().count(refused) > was_refused
