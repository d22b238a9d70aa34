"""No secret on a command line (issue 25, finding 3): every local user can read every
process's argv (``ps``, ``/proc/PID/cmdline``). ``serve --api-key-file`` takes the key from
a file that must be the user's own and 0600 or stricter; ``--api-key`` still works but
warns; agent specs cannot put ``{api_key}`` in an agent's argv; and the processes mlx-kit
starts (the server `launch` starts, the engine process, ``mlx.launch`` and the ranks, the
agent) carry the key in their environment only, which the test proves by reading
``/proc/<pid>/cmdline`` of each."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import psutil
import pytest

from kit.cli.api_key import ARGV_WARNING, MAX_KEY_FILE, read_key_file
from kit.errors import ConfigError, HarnessError
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import all_specs
from tests.helpers import (clean_env, edited_spec, flat, free_port, needs_proc, run_kit,
                           spawn_server, stop, wait_health, wait_until)

KEY = "sekret-argv-key-0123456789"


def _key_file(folder: Path, mode: int = 0o600, text: str = KEY + "\n") -> Path:
    path = folder / "api-key"
    path.write_text(text)
    path.chmod(mode)
    return path


# --- the key file ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_key_file_of_ones_own_0600_or_stricter_gives_its_first_line(tmp_path, mode):
    assert read_key_file(_key_file(tmp_path, mode, f"  {KEY}  \nsecond line\n")) == KEY


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_serve_refuses_a_key_file_others_can_read_or_write_naming_its_path_and_mode(
        tmp_path, mode):
    path = _key_file(tmp_path, mode)
    hf = tmp_path / "hf"
    r = run_kit(tmp_path, "serve", "--api-key-file", str(path), "--port", str(free_port()),
                HF_HOME=str(hf))
    assert r.returncode == 1
    text = flat(r.stderr)
    assert f"--api-key-file {path}: mode {mode:04o}" in text
    assert "0600 or stricter" in text and f"chmod 600 {path}" in text
    assert "Traceback" not in r.stderr + r.stdout
    assert not hf.exists(), "a model was looked up before the refusal"


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path):
    path = _key_file(tmp_path)
    os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(ConfigError, match="owned by uid 65534, not by you"):
        read_key_file(path)


def test_a_key_file_that_is_a_fifo_a_folder_oversized_or_empty_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opened non-blocking: refused, not a hang
    with pytest.raises(ConfigError, match="not a regular file"):
        read_key_file(fifo)
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_key_file(folder)
    (big := tmp_path / "big").write_text("k" * (MAX_KEY_FILE + 1))
    big.chmod(0o600)
    with pytest.raises(ConfigError, match=f"larger than {MAX_KEY_FILE} bytes"):
        read_key_file(big)
    for text in ("", "\n", "   \nkey-on-line-two\n"):
        with pytest.raises(ConfigError, match="no key on its first line"):
            read_key_file(_key_file(tmp_path, 0o600, text))
    with pytest.raises(ConfigError, match="No such file"):
        read_key_file(tmp_path / "missing")


def test_a_symlink_to_a_file_others_can_read_is_refused_by_the_target_s_mode(tmp_path):
    target = _key_file(tmp_path, 0o644)
    (link := tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match="mode 0644"):
        read_key_file(link)


def test_serve_api_key_on_the_command_line_warns_that_other_users_can_read_it(tmp_path):
    # a bad --allow-origin ends the start right after the key is read: no model needed
    r = run_kit(tmp_path, "serve", "--api-key", KEY, "--allow-origin", "nowhere")
    assert ARGV_WARNING in flat(r.stderr) and "--allow-origin" in r.stderr
    assert KEY not in r.stderr
    r = run_kit(tmp_path, "serve", "--allow-origin", "nowhere", MLX_KIT_API_KEY=KEY)
    assert "warning: --api-key" not in r.stderr, "the environment is the safe form"


def test_the_key_given_twice_or_two_different_keys_are_refused(tmp_path):
    path = _key_file(tmp_path)
    r = run_kit(tmp_path, "serve", "--api-key", KEY, "--api-key-file", str(path))
    assert r.returncode == 1 and "--api-key and --api-key-file both give a key" in flat(r.stderr)
    r = run_kit(tmp_path, "serve", "--api-key-file", str(path), MLX_KIT_API_KEY="other")
    assert r.returncode == 1
    assert f"MLX_KIT_API_KEY and --api-key-file {path} hold different keys" in flat(r.stderr)


# --- agents' command lines ------------------------------------------------------------------

def test_an_agent_spec_naming_the_key_in_its_launch_args_is_refused():
    data, where = edited_spec("claude", lambda t: t.replace(
        'args = ["--settings", "{file0}"]', 'args = ["--settings", "{file0}", "{api_key}"]'))
    with pytest.raises(HarnessError) as e:
        parse_spec(data, where)
    assert "launch.args" in e.value.message and "may not name {api_key}" in e.value.message
    assert "launch.env" in (e.value.hint or "")


@pytest.mark.parametrize("agent", sorted(all_specs()))
def test_no_shipped_agent_gets_the_key_on_its_command_line(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = all_specs()[agent]
    local = {"context_window": 8192, "max_tokens": 1024}
    argv, _env = spec.launch_command("/bin/" + agent, [], local=local,
                                     environ={"MLX_KIT_API_KEY": KEY},
                                     root_url="http://127.0.0.1:8090")
    assert not any(KEY in a for a in argv), argv


# --- every process mlx-kit starts --------------------------------------------------------

def _tree(pid: int) -> dict[int, bytes]:
    """``pid`` and every descendant, each with its raw ``/proc/<pid>/cmdline``."""
    needs_proc("each process's command line")
    root = psutil.Process(pid)
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            out[p.pid] = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):  # ended while we walked
            pass
    return out


def _assert_no_key(tree: dict[int, bytes]) -> None:
    leaks = {pid: cmd.replace(b"\0", b" ") for pid, cmd in tree.items() if KEY.encode() in cmd}
    assert not leaks, f"the API key is on these command lines: {leaks}"


def _assert_keyed(root: str) -> None:
    assert httpx.get(root + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(root + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.fixture
def fake_claude(tmp_path) -> tuple[Path, Path]:
    """A `claude` on PATH that records its command line and the token it got from the
    environment; (folder, record)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    record = tmp_path / "claude-ran"
    script = bindir / "claude"
    script.write_text("#!/bin/sh\n"
                      f"tr '\\0' ' ' < /proc/$$/cmdline > '{record}'\n"
                      f"printf '\\ntoken=%s\\n' \"$ANTHROPIC_AUTH_TOKEN\" >> '{record}'\n")
    script.chmod(stat.S_IRWXU)
    return bindir, record


def test_launch_s_server_its_engine_and_the_agent_carry_the_key_off_their_command_lines(
        hf_home, tmp_path, fake_claude):
    bindir, record = fake_claude
    port = free_port()
    env = clean_env(tmp_path, hf_home, MLX_KIT_API_KEY=KEY,
                    PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    try:
        r = run_kit(env, "launch", "claude", "--url", f"http://127.0.0.1:{port}",
                    "--timeout", "300", "--", "-p", "hi", cwd=tmp_path, timeout=400)
        assert r.returncode == 0, r.stderr[-2000:]
        ran = record.read_text()
        assert f"token={KEY}" in ran, "the agent got the key through its environment"
        assert KEY not in ran.splitlines()[0], "the agent's command line holds the key"
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        _assert_keyed(f"http://127.0.0.1:{port}")
        tree = _tree(health["pid"])
        assert health["engine_pid"] in tree, "the engine process is the server's child"
        _assert_no_key(tree)
    finally:
        run_kit(env, "stop", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path, timeout=60)


def test_a_keyed_3_rank_world_has_the_key_on_no_command_line(hf_home, tiny_world_model,
                                                            tmp_path):
    path = _key_file(tmp_path)
    # the variable too (the same key): the ranks inherit the server's environment, which
    # must not turn into arguments (mlx.launch's --env, an ssh command line); the tiny
    # random llama: the command lines, not the text, are checked
    server = spawn_server(tmp_path, hf_home, "--api-key-file", str(path), "--ranks", "3",
                          "--rank-timeout", "60", "--model", str(tiny_world_model),
                          MLX_KIT_API_KEY=KEY)
    try:
        wait_health(server.root, server.proc, timeout=300)
        world = wait_until(lambda: server.health()["model_state"] == "ready"
                           and server.health()["distributed"], 300, every=0.5,
                           what="the 3-rank world being ready")
        _assert_keyed(server.root)
        tree = _tree(server.proc.pid)
        ranks = [r["pid"] for r in world["ranks"]]
        assert len(ranks) == 3 and set(ranks) <= set(tree), (ranks, sorted(tree))
        assert any(b"mlx.launch" in cmd for cmd in tree.values())
        _assert_no_key(tree)
        assert str(path).encode() in tree[server.proc.pid], "the server names the file only"
    finally:
        stop(server)
