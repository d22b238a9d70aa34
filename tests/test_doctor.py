"""``mlx-kit doctor``: each line a user reads (status, detail, fix) and the exit code, as
text and as ``--json``, on real processes: the CLI in a throwaway HOME, mlx imported in
its child, real listeners on loopback for a taken or hung port, and fake agent binaries
(shell scripts that print a version, or hang) on a PATH without the real agents, so a
model-free run costs ~3 s instead of every Node agent's start-up. One test runs doctor
against the session's real server (``server`` fixture, marked ``model``)."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.doctor.check import Check
from kit.urls import parse_url
from tests.helpers import agentless_path, free_port, run_kit

PI_INSTALL = "npm install -g @earendil-works/pi-coding-agent@1.6.0"
NO_PROXY_FIX = ("export NO_PROXY=localhost,127.0.0.1,::1 no_proxy=localhost,127.0.0.1,::1")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def fake_agent(folder: Path, name: str, body: str) -> Path:
    """A shell script ``name`` in ``folder`` (made) running ``body``."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return folder


def doctor_json(home: Path, url: str, bindir: Path | None = None, **env: str):
    """``mlx-kit doctor --url URL --json`` with only ``bindir``'s agents on PATH: (the
    result, the report, its checks by name)."""
    path = os.pathsep.join(filter(None, [str(bindir) if bindir else None, agentless_path()]))
    js = run_kit(home, "doctor", "--url", url, "--json", PATH=path, **env)
    assert js.stdout.endswith("}\n"), js.stdout + js.stderr
    report = json.loads(js.stdout)
    return js, report, {c["name"]: c for c in report["checks"]}


def doctor(home: Path, url: str, bindir: Path | None = None, **env: str):
    """``mlx-kit doctor --url URL``, as text and as ``--json`` (each run ~2-5 s: a Python
    start and mlx's import in the child): (text result, JSON result, report, checks)."""
    path = os.pathsep.join(filter(None, [str(bindir) if bindir else None, agentless_path()]))
    text = run_kit(home, "doctor", "--url", url, PATH=path, **env)
    return (text, *doctor_json(home, url, bindir, **env))


def line(text: str, name: str) -> str:
    """The report line of check ``name`` (``  <status>  <name>  <detail>``), its whitespace
    runs collapsed."""
    for ln in text.splitlines():
        parts = ln.split()
        if len(ln) > 6 and ln[2:6].strip() in ("ok", "warn", "fail") and \
                " ".join(parts[1:]).startswith(name + " "):
            return " ".join(parts)
    raise AssertionError(f"no line for {name!r} in:\n{text}")


def fix_of(text: str, name: str) -> str:
    """The ``fix:`` line under check ``name``'s line."""
    lines = text.splitlines()
    target = line(text, name)
    for i, ln in enumerate(lines):
        if " ".join(ln.split()) == target:
            nxt = lines[i + 1].strip()
            assert nxt.startswith("fix: "), nxt
            return nxt[len("fix: "):]
    raise AssertionError(name)


# --- the CLI, model-free ------------------------------------------------------------------

def test_a_healthy_machine_without_a_server_exits_0(home, tmp_path):
    bindir = fake_agent(tmp_path / "bin", "pi", 'echo "1.6.0"')
    url = f"http://127.0.0.1:{free_port()}"
    text, js, report, checks = doctor(home, url, bindir=bindir)
    assert text.returncode == 0 and js.returncode == 0, text.stdout + text.stderr
    out = text.stdout
    port = parse_url(url).port
    assert line(out, "server") == f"ok server no server at {url} (`mlx-kit launch` starts one)"
    assert line(out, "port") == f"ok port {port} is free"
    assert line(out, "proxy") == "ok proxy no proxy variables set"
    assert line(out, "pi") == ("ok pi 1.6.0 (verified 0.73.1-1.6.0); not configured "
                               "(launch configures it)")
    assert line(out, "mlx").startswith("ok mlx mlx 0.")
    assert line(out, "python").startswith(f"ok python {sys.version.split()[0]}")
    assert line(out, "starter") == ("ok starter mlx-kit/SmolLM2-135M-Instruct not built yet "
                                    "(the first launch builds it, ~5-30 s; or: mlx-kit pull "
                                    "mlx-kit/SmolLM2-135M-Instruct)")
    assert str(home / ".cache" / "huggingface" / "hub") in line(out, "hf cache")
    assert out.splitlines()[-1].startswith("0 failed, ") and \
        out.splitlines()[-1].endswith(": launch should work")
    # --json: the same lines, every one with the keys the help names
    assert report["ok"] is True and report["url"] == url + "/v1"
    assert report["summary"]["fail"] == 0
    assert checks["server"]["status"] == "ok" and checks["server"]["data"]["running"] is False
    assert checks["pi"]["data"]["version"] == "1.6.0" and checks["pi"]["fix"] is None
    assert checks["not installed"]["status"] == "ok" and "pi" not in \
        checks["not installed"]["data"]["agents"]
    for c in report["checks"]:
        assert set(c) == {"area", "name", "status", "detail", "fix", "data"}
        assert (c["fix"] is None) == (c["status"] == "ok"), c
    assert not (home / ".local").exists() and not (home / ".cache").exists()  # wrote nothing


def test_an_agent_newer_than_verified_is_a_warning_with_the_pinned_install(home, tmp_path):
    bindir = fake_agent(tmp_path / "bin", "pi", 'echo "pi 99.0.1"')
    text, js, _, checks = doctor(home, f"http://127.0.0.1:{free_port()}", bindir=bindir)
    assert text.returncode == 0 and js.returncode == 0  # a warning alone: exit 0
    assert line(text.stdout, "pi") == ("warn pi 99.0.1 is newer than the newest verified "
                                       "(1.6.0): untested; not configured (launch configures "
                                       "it)")
    fix = f"if launch misbehaves, install the verified one: {PI_INSTALL}"
    assert fix_of(text.stdout, "pi") == fix
    assert checks["pi"]["status"] == "warn" and checks["pi"]["fix"] == fix
    assert text.stdout.splitlines()[-1] == "0 failed, 1 warning: launch should work"


def test_an_agent_launch_configures_by_environment_is_not_installed_until_found(home):
    """Copilot's spec writes no file (launch sets its environment): without its binary it
    is one of the agents not installed, not a "copilot not found; configured" warning."""
    js, report, checks = doctor_json(home, f"http://127.0.0.1:{free_port()}")
    assert "copilot" not in checks and "copilot" in checks["not installed"]["data"]["agents"]
    assert [c for c in report["checks"] if c["area"] == "agents" and c["status"] != "ok"] == []


def test_a_proxy_that_catches_loopback_fails_with_the_no_proxy_fix(home):
    url = f"http://127.0.0.1:{free_port()}"
    text, js, report, checks = doctor(home, url, HTTP_PROXY="http://127.0.0.1:9")
    assert text.returncode == 1 and js.returncode == 1
    want = (f"fail proxy HTTP_PROXY is set and NO_PROXY does not name 127.0.0.1: requests "
            f"to {url} go to the proxy")
    assert line(text.stdout, "proxy") == want
    assert fix_of(text.stdout, "proxy") == NO_PROXY_FIX
    assert checks["proxy"]["status"] == "fail" and checks["proxy"]["fix"] == NO_PROXY_FIX
    assert report["ok"] is False and report["summary"]["fail"] == 1
    assert "launch will fail until the failed lines are fixed" in text.stdout


class _NotUs(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_port_taken_by_another_program_fails(home):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotUs)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        js, _, checks = doctor_json(home, url)
    finally:
        httpd.shutdown()
    assert js.returncode == 1
    detail = checks["server"]["detail"]
    assert re.fullmatch(rf"{re.escape(url)} is in use by something that is not mlx-kit "
                        r"\(HTTP 404 from .+\)", detail), detail
    assert checks["server"]["fix"] == "stop it, or use --url with another port"
    port = httpd.server_address[1]
    assert checks["port"]["status"] == "fail"
    assert checks["port"]["detail"].startswith(f"{port} is taken")
    assert checks["port"]["fix"] == (f"stop it, or use another port: mlx-kit launch AGENT "
                                     f"--url http://127.0.0.1:{port + 1} (or set MLX_KIT_URL)")


def test_a_broken_mlx_fails_its_line_and_the_rest_still_reports(home, tmp_path):
    fake = tmp_path / "shadow" / "mlx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ImportError('libmlx.so: cannot open shared object file')\n")
    pythonpath = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    js, _, checks = doctor_json(home, f"http://127.0.0.1:{free_port()}",
                                PYTHONPATH=pythonpath)
    assert js.returncode == 1
    assert checks["mlx"]["status"] == "fail"
    assert checks["mlx"]["detail"] == ("mlx does not work: ImportError: libmlx.so: cannot "
                                       "open shared object file")
    assert checks["mlx"]["fix"] == (f"{sys.executable} -m pip install 'mlx[cpu]' "
                                          "(or reinstall mlx-kit)")
    assert "device" not in checks and checks["server"]["status"] == "ok"


def test_an_agent_configured_for_another_url_is_a_warning(home, tmp_path):
    bindir = fake_agent(tmp_path / "bin", "pi", 'echo "1.6.0"')
    path = os.pathsep.join([str(bindir), agentless_path()])
    other = f"http://127.0.0.1:{free_port()}"
    r = run_kit(home, "harness", "install", "pi", "--url", other, PATH=path)
    assert r.returncode == 0, r.stderr
    url = f"http://127.0.0.1:{free_port()}"
    js, _, checks = doctor_json(home, url, bindir=bindir)
    assert js.returncode == 0
    assert checks["pi"]["status"] == "warn"
    assert checks["pi"]["detail"] == (f"1.6.0 (verified 0.73.1-1.6.0); configured; "
                                      f"points at {other}/v1, not {url}/v1")
    assert checks["pi"]["fix"] == (f"mlx-kit launch pi rewrites it (or: mlx-kit "
                                   f"harness install pi --url {url})")
    assert checks["pi"]["data"]["base_url"] == other + "/v1"


# --- single checks, in-process: bounds and rules ------------------------------------------

def test_a_hung_listener_is_reported_within_the_timeout():
    from kit.doctor.server import server_checks

    with socket.socket() as s:  # accepts (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        url = parse_url(f"http://127.0.0.1:{s.getsockname()[1]}")
        start = time.monotonic()
        checks, p = server_checks(url, timeout=0.5)
        took = time.monotonic() - start
    assert took < 3, took
    by = {c.name: c for c in checks}
    assert p.kind == "other" and by["server"].status == "fail"
    assert "no HTTP answer (ReadTimeout)" in by["server"].detail


def test_a_hung_agent_binary_is_a_warning_within_the_timeout(tmp_path, monkeypatch):
    from kit.doctor.agents import agent_checks

    bindir = fake_agent(tmp_path / "bin", "pi", "sleep 20")  # its child keeps the pipes
    monkeypatch.setenv("PATH", os.pathsep.join([str(bindir), agentless_path()]))
    monkeypatch.setenv("HOME", str(tmp_path))
    start = time.monotonic()
    checks = agent_checks(parse_url(f"http://127.0.0.1:{free_port()}"), lambda: None,
                          timeout=1)
    assert time.monotonic() - start < 10
    pi = {c.name: c for c in checks}["pi"]
    assert pi.status == "warn"
    assert pi.detail.startswith("pi --version gave no version (no output within 1 s)")
    assert pi.fix == f"run pi --version yourself; if it fails or hangs, reinstall: {PI_INSTALL}"


@pytest.mark.parametrize("env, status", [
    ({}, "ok"),
    ({"http_proxy": "http://proxy:3128"}, "fail"),
    ({"ALL_PROXY": "socks5://proxy:1080"}, "fail"),
    ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "localhost"}, "fail"),  # not the IP
    ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "127.0.0.0/8"}, "fail"),  # httpx: no CIDR
    ({"HTTP_PROXY": "http://proxy:3128", "no_proxy": "*"}, "ok"),
    ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "example.com, 127.0.0.1"}, "ok"),
    ({"HTTPS_PROXY": "http://proxy:3128"}, "warn"),  # does not route http://, agents may
])
def test_proxy_rules_follow_httpx(env, status):
    from kit.doctor.proxy import proxy_check

    check = proxy_check(parse_url("http://127.0.0.1:8090"), env)
    assert check.status == status, check
    assert (check.fix is None) == (status == "ok")


def test_proxy_rules_agree_with_httpx_itself(monkeypatch):
    """Cross-checked against httpx's own transport choice (a private method: this test
    only, so a change in httpx shows here first)."""
    import httpx

    from kit.doctor.proxy import bypassed

    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.1:3128")
    for no_proxy in ("", "localhost", "127.0.0.1", "127.0.0.0/8", "*", "::1", "localhost:8090"):
        monkeypatch.setenv("NO_PROXY", no_proxy)
        client = httpx.Client()
        for host in ("127.0.0.1", "localhost", "[::1]"):
            direct = client._transport_for_url(httpx.URL(f"http://{host}:8090/")) \
                is client._transport
            assert bypassed(host, no_proxy) == direct, (no_proxy, host)


def test_without_openblas_the_fix_names_the_package_and_the_speed_up():
    from kit.doctor.system import _blas

    check = _blas({"blas": None, "blas_setting": "auto"})
    assert (check.status, check.detail) == ("warn", "no OpenBLAS found: mlx uses its bundled "
                                            "reference BLAS")
    assert check.fix == ("sudo apt-get install libopenblas0-pthread (mlx-kit loads it by "
                         "itself): prefill's float32 matmuls ~34x faster (512x576x1536: "
                         "150 ms bundled, 4.4 ms)")
    off = _blas({"blas": None, "blas_setting": "off"})
    assert off.status == "warn" and off.fix.startswith("unset MLX_KIT_BLAS: ")


def test_a_check_that_crashes_is_a_warning_not_a_crash(monkeypatch):
    from kit.doctor import run

    def boom():
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("kit.doctor.run.cache_checks", boom)
    monkeypatch.setattr("kit.doctor.run.agent_checks", lambda url, up: [])
    monkeypatch.setattr("kit.doctor.run.mlx_checks", lambda: [])
    checks = run.run_checks(parse_url(f"http://127.0.0.1:{free_port()}"))
    cache = [c for c in checks if c.area == "cache"]
    assert cache == [Check("cache", "cache", "warn", "the check itself failed: RuntimeError: "
                           "disk on fire", "report it (mlx-kit's bug)")]


# --- against the real server ---------------------------------------------------------------

@pytest.mark.model
def test_a_running_server_is_reported_with_its_model(server, home):
    text, js, report, checks = doctor(home, server.root)
    assert text.returncode == 0 and js.returncode == 0, text.stdout
    health = server.health()
    assert line(text.stdout, "server") == (f"ok server mlx-kit {health['version']} at "
                                           f"{server.root} (pid {health['pid']})")
    assert line(text.stdout, "model") == f"ok model local -> {health['model']} (ready)"
    assert line(text.stdout, "api key") == "ok api key not required"
    assert line(text.stdout, "port") == f"ok port {server.port} is mlx-kit's (pid {health['pid']})"
    assert checks["server"]["data"]["running"] is True and report["ok"] is True


@pytest.mark.model
def test_a_server_that_wants_a_key_fails_until_the_key_is_exported(keyed_server, home):
    from tests.helpers import TEST_KEY

    js, report, checks = doctor_json(home, keyed_server.root)
    assert js.returncode == 1 and report["ok"] is False
    assert checks["api key"]["status"] == "fail"
    assert checks["api key"]["detail"] == (f"the server at {keyed_server.root} requires an "
                                           "API key and MLX_KIT_API_KEY is not set")
    assert checks["api key"]["fix"] == "export MLX_KIT_API_KEY=<the server's --api-key>"
    js, report, checks = doctor_json(home, keyed_server.root, MLX_KIT_API_KEY=TEST_KEY)
    assert js.returncode == 0, checks["api key"]
    assert checks["api key"]["detail"] == "required; MLX_KIT_API_KEY is accepted"
    js, _, checks = doctor_json(home, keyed_server.root, MLX_KIT_API_KEY="wrong")
    assert js.returncode == 1
    assert checks["api key"]["detail"] == "required, and MLX_KIT_API_KEY is not the server's key"


def test_a_macos_system_proxy_fails_unless_no_proxy_is_set(monkeypatch):
    """macOS's network settings cannot exist here: sys.platform and urllib's reading of
    them (what httpx asks) are stood in for."""
    import urllib.request

    from kit.doctor.proxy import proxy_check

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(urllib.request, "getproxies",
                        lambda: {"http": "http://proxy.corp:8080", "https": "http://proxy.corp:8080"})
    for name in [k for k in os.environ if k.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    url = parse_url("http://127.0.0.1:8090")
    check = proxy_check(url)
    assert (check.status, check.fix) == ("fail", NO_PROXY_FIX)
    assert check.detail == ("the macOS network settings set a proxy (http, https): httpx "
                            "sends requests to http://127.0.0.1:8090 there")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")  # alone, it turns the fallback off
    assert proxy_check(url).status == "ok"


def test_an_https_url_with_nothing_there_fails_as_launch_would():
    from kit.doctor.server import server_checks

    checks, _ = server_checks(parse_url(f"https://127.0.0.1:{free_port()}"), timeout=1)
    assert [(c.name, c.status, c.fix) for c in checks] == [
        ("server", "fail", "use an http:// URL to start a local server")]
