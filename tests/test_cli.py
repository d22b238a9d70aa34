"""The `mlx-kit` command line as a user runs it: exit codes, one-line errors with hints and
never a traceback, URL handling, and a cheap import."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.errors import ConfigError
from kit.urls import DEFAULT_URL, parse_url
from tests.helpers import clean_env, flat, free_port, run_kit


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def other_http_server(tmp_path):
    """``python -m http.server`` on loopback: an HTTP server that is not mlx-kit."""
    port = free_port()
    docroot = tmp_path / "www"
    docroot.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1"], cwd=docroot, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"http.server did not start on port {port}")
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def fake_pi(tmp_path) -> tuple[Path, Path]:
    """A folder holding only a `pi` script that records that it ran; (folder, record)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    ran = tmp_path / "pi-ran"
    script = bindir / "pi"
    script.write_text(f"#!/bin/sh\necho \"$@\" > '{ran}'\n")
    script.chmod(0o755)
    return bindir, ran


# --- basics --------------------------------------------------------------------------

def test_help_lists_the_commands(home):
    r = run_kit(home, "--help")
    assert r.returncode == 0, r.stderr
    for command in ("serve", "launch", "status", "stop", "harness"):
        assert command in r.stdout


def test_version(home):
    r = run_kit(home, "--version")
    assert r.returncode == 0
    assert r.stdout.strip() == "mlx-kit 0.1.0"


def test_importing_the_cli_does_not_import_heavy_packages(home):
    code = ("import json, sys, kit.cli; heavy = {'mlx', 'mlx_lm', 'fastapi', 'transformers'}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))")
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(home), cwd=home,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


# --- URLs ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    "http://127.0.0.1:8090", "http://127.0.0.1:8090/", "http://127.0.0.1:8090/v1",
    "http://127.0.0.1:8090/v1/", "  http://127.0.0.1:8090/v1/ ",
])
def test_parse_url_with_or_without_v1_gives_one_root(raw):
    u = parse_url(raw)
    assert (u.root, u.v1, u.host, u.port) == (
        "http://127.0.0.1:8090", "http://127.0.0.1:8090/v1", "127.0.0.1", 8090)


@pytest.mark.parametrize("raw, root", [
    ("http://localhost", "http://localhost:80"),
    ("https://example.test/v1", "https://example.test:443"),
    ("http://[::1]:9000/v1", "http://[::1]:9000"),
])
def test_parse_url_default_ports_and_ipv6(raw, root):
    assert parse_url(raw).root == root


@pytest.mark.parametrize("raw", [
    "ftp://127.0.0.1:8090", "127.0.0.1:8090", "http://:8090", "http://127.0.0.1:8090/api",
    "http://127.0.0.1:8090/v1/v1", "http://127.0.0.1:8090/v1?x=1", "http://127.0.0.1:8090#x",
    "http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://127.0.0.1:0",
])
def test_parse_url_rejects_bad_urls(raw):
    with pytest.raises(ConfigError):
        parse_url(raw)


@pytest.mark.parametrize("raw", ["http://[::1", "http://[not-an-ip]:8090"])
def test_a_malformed_url_is_a_config_error_with_the_hint_not_a_crash(tmp_path, raw):
    with pytest.raises(ConfigError, match="not a server URL"):
        parse_url(raw)
    r = run_kit(tmp_path, "status", MLX_KIT_URL=raw)
    assert r.returncode == 1, r.stderr
    assert f"error: not a server URL: {raw!r}" in r.stderr
    assert "hint: use http://HOST:PORT" in r.stderr
    assert "unexpected error" not in r.stderr and not list(tmp_path.rglob("crash-*.log"))


def test_parse_url_honours_the_env_var(monkeypatch):
    monkeypatch.setenv("MLX_KIT_URL", "http://127.0.0.1:9911/v1/")
    assert parse_url().root == "http://127.0.0.1:9911"
    assert parse_url("http://127.0.0.1:9922").root == "http://127.0.0.1:9922"  # flag wins
    monkeypatch.delenv("MLX_KIT_URL")
    assert parse_url().root == DEFAULT_URL


def test_cli_bad_url_is_a_clean_error(home):
    r = run_kit(home, "status", "--url", "ftp://127.0.0.1:1")
    assert r.returncode == 1
    assert "not a server URL" in r.stderr and "Traceback" not in r.stderr


# --- launch / harness / status errors --------------------------------------------------

@pytest.mark.parametrize("agent, install", [
    ("pi", "npm install -g @earendil-works/pi-coding-agent"),
    ("copilot", "npm install -g @github/copilot@1.0.102"),  # configured by launch's env only
    ("kilo", "npm install -g @kilocode/cli@7.7.7"),
])
def test_launch_without_the_agent_says_how_to_install_it(home, tmp_path, agent, install):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    r = run_kit(home, "launch", agent, PATH=str(empty))
    assert r.returncode == 1
    assert install in r.stderr
    assert "not installed" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_install_of_an_unknown_agent_is_a_clean_error(home, monkeypatch):
    from kit.harness.spec_loader import all_specs

    r = run_kit(home, "harness", "install", "nosuchagent")
    assert r.returncode == 1
    assert "unknown agent 'nosuchagent'" in r.stderr
    monkeypatch.setenv("HOME", str(home))  # the same (empty) user config dir as the command
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert "known agents: " + ", ".join(sorted(all_specs())) in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_status_with_no_server_exits_3(home):
    url = f"http://127.0.0.1:{free_port()}"
    r = run_kit(home, "status", "--url", url)
    assert r.stdout == f"no mlx-kit server is running on {url}\n"
    assert "start one with `mlx-kit serve`" in r.stderr
    assert r.returncode == 3


def test_status_reads_the_url_from_the_env(home):
    url = f"http://127.0.0.1:{free_port()}"
    r = run_kit(home, "status", MLX_KIT_URL=url + "/v1")
    assert f"no mlx-kit server is running on {url}" in r.stdout


def test_status_against_another_http_server_says_not_mlx_kit(home, other_http_server):
    r = run_kit(home, "status", "--url", other_http_server)
    assert r.returncode == 1
    assert "not mlx-kit" in flat(r.stderr)
    assert "Traceback" not in r.stderr + r.stdout


def test_launch_against_another_http_server_stops_before_pi(home, other_http_server, fake_pi):
    bindir, ran = fake_pi
    r = run_kit(home, "launch", "pi", "--url", other_http_server, "--timeout", "10",
            PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    assert r.returncode == 1
    assert "not mlx-kit" in flat(r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert not ran.exists(), "pi was run although the server check failed"
    assert not (home / ".pi").exists(), "the extension was installed for a foreign server"


def test_serve_on_all_interfaces_without_api_key_is_refused(home, tmp_path):
    hf = tmp_path / "hf"
    started = time.monotonic()
    r = run_kit(home, "serve", "--host", "0.0.0.0", "--port", str(free_port()),
            HF_HOME=str(hf))
    assert r.returncode == 1
    assert "refusing to listen on 0.0.0.0 without an API key" in flat(r.stderr)
    assert "--api-key" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not hf.exists(), "a model was looked up before the refusal"
    assert time.monotonic() - started < 30


# --- regressions from a new-user session ----------------------------------------------------

@pytest.mark.parametrize("args", [["launch"], ["serve", "--port", "abc"], ["bogus"],
                                  ["status", "--bogus"], ["serve", "--port", "70000"],
                                  ["serve", "--log-level", "loud"]])
def test_usage_errors_are_usage_errors_not_crashes(args, tmp_path):
    """Regression: typer bundles its own click, so usage errors escaped as 'unexpected
    error' with a crash log."""
    r = run_kit(clean_env(tmp_path), *args, timeout=60)
    assert r.returncode == 2
    assert "unexpected error" not in r.stderr and "Traceback" not in r.stderr


def test_stop_never_kills_a_process_named_by_a_stale_pid_file(tmp_path):
    """Regression: a pid file left by a killed server, naming a pid since reused by another
    program, made `stop` kill that program."""
    port = free_port()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / ".local" / "state" / "mlx-kit"
        state.mkdir(parents=True)
        (state / f"server-{port}.json").write_text(json.dumps({"pid": bystander.pid}))
        r = run_kit(clean_env(tmp_path), "stop", "--url", f"http://127.0.0.1:{port}",
                    timeout=60)
        assert r.returncode == 0 and "no mlx-kit server" in r.stdout
        assert bystander.poll() is None  # still alive
        assert not (state / f"server-{port}.json").exists()  # the stale file is gone
    finally:
        bystander.kill()


def test_launch_with_https_url_says_why_and_starts_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pi").write_text("#!/bin/sh\necho fake pi ran\n")
    (bin_dir / "pi").chmod(0o755)
    env = clean_env(tmp_path, PATH=f"{bin_dir}:{clean_env(tmp_path)['PATH']}")
    port = free_port()
    r = run_kit(env, "launch", "pi", "--url", f"https://127.0.0.1:{port}", "--timeout", "5",
                timeout=60)
    assert r.returncode == 1 and "plain HTTP" in r.stderr
    assert "fake pi ran" not in r.stdout
    with socket.socket() as s:  # nothing was left listening
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_an_error_naming_a_toml_table_prints_it_not_as_markup(home):
    """rich read `[vars]` in a hint as a markup tag and dropped it: `hint: toy's : x`."""
    root = home / ".config" / "mlx-kit"
    (root / "harnesses").mkdir(parents=True)
    (root / "templates" / "toy").mkdir(parents=True)
    (root / "harnesses" / "toy.toml").write_text(
        'name = "toy"\nbinary = "toy"\ninstall = "true"\napi = "openai-responses"\n'
        '[config_dir]\ndefault = "~/.toy"\n[vars]\nx = 1\n'
        '[[files]]\npath = "toy.json"\ntemplate = "toy/toy.json.j2"\n')
    (root / "templates" / "toy" / "toy.json.j2").write_text("{{ marker }} {{ vars.y }}\n")
    r = run_kit(home, "harness", "show", "toy")
    assert r.returncode == 1
    assert "hint: toy's [vars]: x" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


# --- fit --ranks: how a model splits over mx.distributed ranks ------------------------------

STARTER = "mlx-kit/SmolLM2-135M-Instruct"


def _share_rows(stdout: str) -> list[list[str]]:
    """The per-rank rows of `fit --ranks` (plain text: rank, layers, weights, KV, total)."""
    rows = [line.split() for line in stdout.splitlines()]
    return [r for r in rows if r and r[0].isdigit()]


def test_fit_ranks_3_prints_each_ranks_share_of_the_starter(hf_home, home):
    r = run_kit(home, "fit", STARTER, "--ranks", "3", "--ctx", "4096", hf_home=hf_home)
    assert r.returncode == 0, r.stderr
    assert f"{STARTER} over 3 ranks: tensor parallel, KV cache for 4096 tokens" in r.stdout
    rows = _share_rows(r.stdout)
    # rank, layers (all 30 on every rank), weights 513 MiB / 3 + the whole embeddings, KV
    # 4096 tokens x 30 layers x 1 of 3 KV heads x 64 x 2 (K, V) x 4 bytes
    assert [row[:2] for row in rows] == [["0", "0-29"], ["1", "0-29"], ["2", "0-29"]]
    assert all(row[2:4] == ["243.13", "MiB"] and row[4:6] == ["60.00", "MiB"] for row in rows)
    assert "ranks 0-2 on this machine: 909.40 MiB" in r.stdout and "-> fits" in r.stdout
    huge = run_kit(home, "fit", STARTER, "--ranks", "3", "--ctx", "100000000",
                   hf_home=hf_home)
    assert huge.returncode == 5 and "does NOT fit" in huge.stdout  # 5: does not fit
    plain = run_kit(home, "fit", STARTER, "--ctx", "2048", hf_home=hf_home)
    assert plain.returncode == 0 and "weights:" in plain.stdout and "rank" not in plain.stdout


def test_fit_ranks_2_names_the_field_and_the_rank_counts_that_work(hf_home, home):
    r = run_kit(home, "fit", STARTER, "--ranks", "2", hf_home=hf_home)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines()[:2] == [
        "error: num_attention_heads is 9, not divisible by 2 ranks; 3, 9 ranks divide it",
        "hint: rank counts that split this model: 3"]
    pipe = run_kit(home, "fit", STARTER, "--ranks", "3", "--pipeline", hf_home=hf_home)
    assert pipe.returncode == 1
    assert "error: mlx-lm has no pipeline mode for model type 'llama'" in pipe.stderr
    assert "hint: split it by tensor parallelism (drop --pipeline)" in pipe.stderr
    assert "Traceback" not in r.stderr + pipe.stderr


def test_fit_hosts_runs_one_rank_per_host_and_checks_only_this_machine(hf_home, home):
    r = run_kit(home, "fit", STARTER, "--hosts", "127.0.0.1,mac2,mac3", "--ctx", "4096",
                hf_home=hf_home)
    assert r.returncode == 0, r.stderr
    assert len(_share_rows(r.stdout)) == 3
    assert "rank 0 on this machine: 303.13 MiB" in r.stdout
    assert "the other hosts' memory is not checked (mac2, mac3)" in r.stdout
    for args, message in [(["--hosts", "a,,b"], "error: --hosts: '' is not a host name"),
                          (["--hosts", "a,b", "--ranks", "3"],
                           "error: --ranks 3 is not a multiple of the 2 hosts"),
                          (["--ranks", "65"], "error: ranks must be 1 to 64, not 65"),
                          (["--pipeline"], "error: --pipeline needs --ranks N or --hosts")]:
        bad = run_kit(home, "fit", STARTER, *args, hf_home=hf_home)
        assert bad.returncode == 1 and bad.stderr.startswith(message), (args, bad.stderr)
    assert run_kit(home, "fit", STARTER, "--ranks", "0", hf_home=hf_home).returncode == 2


def test_serve_refuses_a_bad_prompt_cache_disk_size_naming_the_flag(home):
    r = run_kit(home, "serve", "--prompt-cache-disk", "lots")
    assert r.returncode == 1
    assert "--prompt-cache-disk: not a size: 'lots'" in flat(r.stderr)
    assert "Traceback" not in r.stderr




def test_num_draft_tokens_without_a_draft_model_is_a_warning(monkeypatch):
    from kit.cli.serve import unused_flags
    from kit.config import EngineConfig

    monkeypatch.delenv("MLX_KIT_NUM_DRAFT_TOKENS", raising=False)
    monkeypatch.delenv("MLX_KIT_DRAFT_MODEL", raising=False)
    given = EngineConfig.from_flags({"num_draft_tokens": 5})
    assert unused_flags(given, frozenset({"num_draft_tokens"})) == [
        "--num-draft-tokens has no effect without --draft-model"]
    assert unused_flags(EngineConfig.from_flags({}), frozenset()) == []
    drafted = EngineConfig.from_flags({"num_draft_tokens": 5, "draft_model": ("d",)})
    assert unused_flags(drafted, frozenset({"num_draft_tokens", "draft_model"})) == []
    monkeypatch.setenv("MLX_KIT_NUM_DRAFT_TOKENS", "4")  # the variable counts as given
    assert unused_flags(EngineConfig.from_flags({}), frozenset()) == [
        "--num-draft-tokens has no effect without --draft-model"]
def test_launch_passes_the_prompt_cache_flags_to_the_server_it_starts(tmp_path):
    from kit.cli.serve import check_startable
    from kit.config import EngineConfig

    assert EngineConfig.from_flags({}).to_argv("launch") == []
    c = EngineConfig.from_flags({"prompt_cache_dir": str(tmp_path / "x" / ".." / "cache"),
                                 "prompt_cache_disk": "2GiB"})
    # the folder absolute (the server may start elsewhere); the size in bytes
    assert c.to_argv("launch") == ["--prompt-cache-dir", str(tmp_path / "x" / ".." / "cache"),
                                   "--prompt-cache-disk", str(2 * 2**30)]
    with pytest.raises(ConfigError, match="--prompt-cache-disk"):
        EngineConfig.from_flags({"prompt_cache_disk": "12x"})
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # refused here, before a server starts (as serve refuses it)
    with pytest.raises(ConfigError, match="refusing --prompt-cache-dir .*writable by"):
        check_startable(EngineConfig.from_flags({"prompt_cache_dir": str(shared)}), None)
    check_startable(EngineConfig.from_flags({"prompt_cache_dir": str(shared),
                                             "prompt_cache_disk": "0"}), None)  # unused
