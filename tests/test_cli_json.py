"""`--json` on the commands that report, the plain tables (never a broken word at 80
columns), `--help` showing flags as flags, sizes in one convention, and the messages of
issue 17 (`swap local`, `swap`/`stop` with no server or another user's server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.errors import ExitCode
from kit.harness.spec_loader import all_specs
from kit.models.memory import human, parse_size
from tests.helpers import clean_env, free_port, run_kit
from tests.models.test_split import llama_like


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def as_json(r) -> dict:
    """stdout parsed as one JSON document (the whole of stdout, nothing around it)."""
    assert r.stdout.endswith("}\n"), r.stdout + r.stderr
    return json.loads(r.stdout)


# --- --json, model-free -----------------------------------------------------------------

def test_status_json_with_no_server(home, dead_url):
    r = run_kit(home, "status", "--json", "--url", dead_url)
    assert r.returncode == 3
    assert as_json(r) == {"url": f"{dead_url}/v1", "running": False}


def test_harness_json_lifecycle_reports_the_paths_it_touched(home, dead_url):
    listed = as_json(run_kit(home, "harness", "list", "--json"))
    assert [a["name"] for a in listed["agents"]] == sorted(all_specs())
    assert listed["problems"] == []
    pi = {a["name"]: a for a in listed["agents"]}["pi"]
    assert pi["installed"] is False and pi["api"] == "/v1/chat/completions"

    installed = as_json(run_kit(home, "harness", "install", "pi", "--json", "--url", dead_url))
    [written] = installed["files"]
    assert written["action"] == "wrote" and Path(written["path"]).is_file()
    assert installed["agent"] == "pi" and installed["url"] == f"{dead_url}/v1"
    assert written["path"] in pi["paths"]
    shown = as_json(run_kit(home, "harness", "show", "pi", "--json", "--url", dead_url))
    assert shown["files"][0]["text"] == Path(written["path"]).read_text()
    again = as_json(run_kit(home, "harness", "install", "pi", "--json", "--url", dead_url))
    assert again["files"][0]["action"] == "unchanged"

    plan = as_json(run_kit(home, "harness", "remove", "pi", "--dry-run", "--json"))
    assert plan["agents"]["pi"]["dry_run"] is True
    assert Path(written["path"]).is_file()  # a dry run changes nothing
    removed = as_json(run_kit(home, "harness", "remove", "pi", "--json"))
    assert removed["agents"]["pi"]["removed"][0] == written["path"]
    assert removed["agents"]["pi"]["changed"] is True and not Path(written["path"]).exists()
    nothing = as_json(run_kit(home, "harness", "remove", "--all", "--json"))
    assert not any(a["changed"] for a in nothing["agents"].values())


def test_harness_remove_all_json_names_the_refused_agent(home, dead_url):
    assert run_kit(home, "harness", "install", "codex", "--url", dead_url).returncode == 0
    profile = home / ".codex" / "mlx-kit.config.toml"
    profile.write_text(profile.read_text() + "# my edit\n")
    r = run_kit(home, "harness", "remove", "--all", "--json")
    assert r.returncode == 1
    report = as_json(r)["agents"]  # one document: the refusal is in it, not a second one
    assert str(profile) in report["codex"]["error"]["message"]
    assert profile.exists()


def test_a_refused_dry_run_json_is_one_error_document(home, dead_url):
    target = home / ".pi" / "agent" / "extensions" / "mlx-kit.ts"
    target.parent.mkdir(parents=True)
    target.write_text("// the user's own extension\n")
    r = run_kit(home, "harness", "install", "pi", "--dry-run", "--json", "--url", dead_url)
    assert r.returncode == 1
    error = as_json(r)["error"]  # json.loads fails on two documents
    assert str(target) in error["message"] and error["exit_code"] == 1
    assert target.read_text() == "// the user's own extension\n"


def run_into(home: Path, stdout, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", *args], env=clean_env(home),
                          cwd=home, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


@pytest.mark.parametrize("args", [("harness", "show", "pi", "--json"),
                                  ("harness", "list"),
                                  ("status", "--json", "--url", "http://127.0.0.1:1")])
def test_a_closed_stdout_pipe_exits_141_silently(home, args):
    """`mlx-kit ... | true`: the reader has left before the first write (its end closed
    here before the start, so the write fails for sure), as with git and ls."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = run_into(home, write, *args)
    finally:
        os.close(write)
    assert r.returncode == ExitCode.BROKEN_PIPE == 141
    assert r.stderr == "" or "error:" in r.stderr  # status's own error line only
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr
    assert not list(home.rglob("crash-*.log"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_full_stdout_is_reported_once_without_a_second_failure(home, json_flag):
    with open("/dev/full", "w") as full:
        r = run_into(home, full, "harness", "show", "pi", *json_flag)
    assert r.returncode == ExitCode.SOFTWARE, r.stderr
    assert r.stderr.count("unexpected error: OSError") == 1
    assert "No space left on device" in r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_fit_json_is_in_bytes(home, tmp_path):
    folder = llama_like(tmp_path / "tiny")
    r = run_kit(home, "fit", str(folder), "--json", "--ctx", "1000")
    out = as_json(r)
    assert r.returncode == 0 and out["fits"] is True
    assert out["kv_bytes"] == out["kv_bytes_per_token"] * 1000 == out["context_window"] * 192
    assert out["total_bytes"] == out["weights_bytes"] + out["kv_bytes"]
    huge = run_kit(home, "fit", str(folder), "--json", "--ctx", str(10**13))
    assert huge.returncode == 5 and as_json(huge)["fits"] is False


def test_fit_ranks_honours_memory_budget_and_names_the_ceiling_like_fit(home, tmp_path):
    folder = llama_like(tmp_path / "tiny")
    single = as_json(run_kit(home, "fit", str(folder), "--json", "--ctx", "100",
                             "--memory-budget", "1MiB"))
    r = run_kit(home, "fit", str(folder), "--json", "--ranks", "3", "--ctx", "100",
                "--memory-budget", "1MiB")
    split = as_json(r)
    assert r.returncode == 0 and split["fits"] is True
    for key in ("model", "context_window", "ceiling_bytes", "ceiling_source", "fits"):
        assert split[key] == single[key], key
    assert split["ceiling_bytes"] == 2**20 and split["ceiling_source"] == "budget"
    assert "available_bytes" not in split
    tight = run_kit(home, "fit", str(folder), "--json", "--ranks", "3", "--ctx", "100",
                    "--memory-budget", "1KiB")
    assert tight.returncode == ExitCode.DOES_NOT_FIT, tight.stderr
    assert as_json(tight)["fits"] is False and as_json(tight)["ceiling_bytes"] == 1024
    text = run_kit(home, "fit", str(folder), "--ranks", "3", "--memory-budget", "1KiB")
    assert text.returncode == 5 and "ceiling: budget 1.00 KiB -> does NOT fit" in text.stdout, text.stdout


# --- plain tables --------------------------------------------------------------------------

def test_tables_never_break_a_model_id_or_a_path_at_80_columns(home, tmp_path):
    home = tmp_path / "a-home-deep-enough" / "that-config-paths-pass-80-columns"
    home.mkdir(parents=True)
    env = clean_env(home, COLUMNS="80")
    listed = as_json(run_kit(env, "harness", "list", "--json"))
    table = run_kit(env, "harness", "list")
    assert table.returncode == 0 and "│" not in table.stdout
    rows = table.stdout.split("\n\n")[0].splitlines()
    assert len(rows) == len(listed["agents"]) + 1 and max(map(len, rows)) <= 80
    paths = {a["name"]: a["paths"] for a in listed["agents"]}
    for agent in ("aider", "goose"):  # the config paths are `harness show`'s: whole lines
        shown = run_kit(env, "harness", "show", agent).stdout.splitlines()
        assert [f"# {p}" for p in paths[agent]] == [ln for ln in shown if ln.startswith("# /")]
        assert max(map(len, shown)) > 80  # the case that used to fold
    models = as_json(run_kit(env, "models", "--json"))
    text = run_kit(env, "models").stdout
    assert models["models"] and all(m["id"] in text for m in models["models"])


# --- --help shows flags as flags ----------------------------------------------------------

def _all_help() -> dict[str, str]:
    from kit.cli.docs import _commands

    return {name: cmd.get_help(ctx) for name, cmd, ctx in _commands()}


def test_help_shows_boolean_flags_without_a_value():
    helps = _all_help()
    assert len(helps) > 10
    for name, text in helps.items():
        assert "<bool>" not in text, name
    serve = helps["mlx-kit serve"]
    assert "  --swap-on-request  " in serve and "--docs / --no-docs" in serve
    assert "--json  " in helps["mlx-kit status"] and "--dry-run  " in helps[
        "mlx-kit harness install"]


# --- sizes: one convention -------------------------------------------------------------------

@pytest.mark.parametrize("text, size", [
    ("8GiB", 8 * 2**30), ("8gib", 8 * 2**30), ("512MiB", 512 * 2**20), ("16MiB", 16 * 2**20),
    ("8GB", 8 * 10**9), ("8G", 8 * 10**9), ("600MB", 600 * 10**6), ("1e9", 10**9),
    ("1024", 1024), ("1.5GiB", 3 * 2**29)])
def test_sizes_mean_what_their_unit_says(text, size):
    assert parse_size(text) == size


def test_sizes_print_in_binary_units_and_round_trip():
    assert human(parse_size("8GiB")) == "8.00 GiB"
    assert human(parse_size("8GB")) == "7.45 GiB"  # not "8.59 GB"
    assert human(parse_size("512MiB")) == "512.00 MiB" and human(100) == "100 B"


@pytest.mark.parametrize("text", ["x", "-1GB", "8 parsecs", "inf", "nan", ""])
def test_a_bad_size_names_it(text):
    from kit.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_size(text)
    assert repr(text) in e.value.message and "GiB" in e.value.hint


# --- messages ---------------------------------------------------------------------------------

def test_stop_on_another_users_server_names_the_owner_and_pid(monkeypatch, capsys, tmp_path):
    """No other user's server can run here (the tests run as one user, often root, whom
    nothing denies): the stand-in for kit.daemon.stop_server raises what psutil raises
    when terminate() hits another user's process."""
    import psutil

    import kit.daemon
    from kit.cli import main

    def denied(url, timeout: float = 15.0):
        raise psutil.AccessDenied(pid=os.getpid())

    monkeypatch.setattr(kit.daemon, "stop_server", denied)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main(["stop", "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    user = psutil.Process().username()
    assert f"user {user} (pid {os.getpid()}) owns it" in err
    assert "hint: stop it as that user" in err and "unexpected" not in err


# --- with a real server -------------------------------------------------------------------

def test_status_models_swap_json_use_the_servers_field_names(server, tmp_path):
    """`status --json` is /health's body (plus url/log/running), `models --json` names the
    model /health names, and `swap local` is a no-op success."""
    import httpx

    home = tmp_path / "cli-home"
    home.mkdir()
    env = clean_env(home)
    status = run_kit(env, "status", "--json", "--url", server.root)
    assert status.returncode == 0, status.stderr
    out = as_json(status)
    health = httpx.get(server.root + "/health").json()
    for key in ("service", "status", "model_state", "model", "context_window", "pid",
                "engine_pid", "swaps", "restarts", "error"):
        assert out[key] == health[key], key
    assert out["running"] is True and out["url"] == server.root + "/v1"

    ids = [m["id"] for m in httpx.get(server.root + "/v1/models").json()["data"]]
    listed = as_json(run_kit(env, "models", "--json", "--url", server.root))
    assert listed["local"] == health["model"] and health["model"] in ids

    noop = run_kit(env, "swap", "local", "--json", "--url", server.root)
    assert noop.returncode == 0, noop.stderr
    assert as_json(noop) == {"model": health["model"], "previous": health["model"],
                             "load_seconds": 0.0, "changed": False}
    text = run_kit(env, "swap", "local", "--url", server.root)
    assert text.stdout == f"local -> {health['model']} (already loaded)\n"
    assert httpx.get(server.root + "/health").json()["swaps"] == health["swaps"]


def test_a_model_that_does_not_fit_exits_5_from_status_and_launch_with_one_log_line(
        hf_home, tmp_path):
    """A server whose model does not fit its --memory-budget: /health names the kind,
    `status` exits 5 (and its --json error is the documented object), launch's wait
    exits 5 too, and the log says it in one line, no traceback."""
    from kit.daemon import wait_ready
    from kit.errors import ModelDoesNotFitError
    from kit.urls import parse_url
    from tests.helpers import spawn_server, stop, wait_until

    s = spawn_server(tmp_path, hf_home, "--memory-budget", "1MiB")
    try:
        health = wait_until(lambda: (h := s.health())["status"] == "failed" and h,
                            timeout=120, what="the load to fail")
        assert health["error_type"] == "model_does_not_fit" and "does not fit" in \
            health["error"]
        text = run_kit(clean_env(s.home, hf_home), "status", "--url", s.root)
        assert text.returncode == ExitCode.DOES_NOT_FIT, text.stderr
        assert f"error: {health['error']}" in text.stderr and "hint: " in text.stderr
        r = run_kit(clean_env(s.home, hf_home), "status", "--json", "--url", s.root)
        assert r.returncode == ExitCode.DOES_NOT_FIT == 5, r.stderr
        out = as_json(r)
        assert out["error"] == {"message": health["error"], "hint": out["error"]["hint"],
                                "exit_code": 5, "type": "ModelDoesNotFitError"}
        assert out["health_error"] == health["error"] and out["status"] == "failed"
        with pytest.raises(ModelDoesNotFitError, match="does not fit"):
            wait_ready(parse_url(s.root), None, s.log, 10)
        log = s.log_text()
        assert log.count("model load failed: ") == 1 and "Traceback" not in log
    finally:
        stop(s)


def test_launch_progress_never_says_serving_before_ready(hf_home, tmp_path, monkeypatch):
    """Regression: launch's spinner showed the server's "serving X as 'local'" log line
    while the model still loaded. Its text now starts with /health's status (and load
    phase) once /health answers, and the server logs "starting ... (loading the model)"."""
    from kit.daemon import ensure_server, log_file, stop_server
    from kit.urls import parse_url

    for name in list(os.environ):
        if name.startswith(("XDG_", "MLX_KIT_", "HF_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    url = parse_url(f"http://127.0.0.1:{free_port()}")
    seen: list[str] = []
    try:
        probe, started = ensure_server(url, None, 120, on_wait=seen.append)
        assert started and probe.ready
    finally:
        stop_server(url)
    assert seen, "the wait showed no progress"
    assert not any("serving" in line for line in seen), seen
    answered = [line for line in seen if line.startswith(("loading", "restarting"))]
    assert all(": " in line for line in answered)  # "<status>[, <phase>]: <log line>"
    assert "(loading the model)" in log_file(url).read_text()
