"""Warm before ready on a real server (`serve --warmup`) and in `launch`'s progress.

On this CPU machine ``auto`` means no warm-up (mlx compiles kernels only on CUDA), so
``--warmup on`` stands in for a CUDA machine: the same shapes run, through the same paths.
"""

from __future__ import annotations

import re
import subprocess
import sys

import httpx

from tests.helpers import (
    clean_env,
    flat,
    free_port,
    openai_for,
    run_kit,
    spawn_server,
    stop,
    wait_health,
    wait_until,
)


def ask(server) -> str:
    r = openai_for(server).chat.completions.create(
        model="local", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": "Say hi."}])
    assert r.usage.completion_tokens >= 1
    return r.choices[0].message.content


def test_warmup_on_reports_warming_up_before_ready_and_logs_the_shapes(hf_home, tmp_path):
    server = spawn_server(tmp_path, hf_home, "--warmup", "on", "--max-batch", "2")
    seen: list[tuple[str, str | None]] = []

    def ready() -> bool:
        h = httpx.get(server.root + "/health", timeout=2).json()
        if not seen or seen[-1] != (h["status"], h["phase"]):
            seen.append((h["status"], h["phase"]))
        return h["status"] == "ok"

    try:
        wait_until(ready, timeout=180, what="the server ready")
        assert ("loading", "warming up") in seen, seen
        assert seen[-1] == ("ok", None)
        assert seen.index(("loading", "warming up")) < seen.index(("ok", None))
        log = server.log_text()
        assert ("warmed up 9 shapes in" in log and "(prefill 512 + decode, prefill 193 + "
                "decode, prefill 97 + decode, prefill 49 + decode, prefill 25 + decode, "
                "prefill 13 + decode, sampled decode, batch x1, batch x2); kernel cache:" in
                log), log[-3000:]
        # the startup lines never said "serving" before the model was ready
        warmed_at = log.index("warmed up 9 shapes")
        assert "serving" not in log[:warmed_at]
        assert "ready: mlx-kit/SmolLM2-135M-Instruct as 'local'" in log[warmed_at:]
        assert ask(server)
    finally:
        stop(server)


def test_warmup_off_skips_it(hf_home, tmp_path):
    server = spawn_server(tmp_path, hf_home, "--warmup", "off")
    try:
        assert wait_health(server.root, server.proc)["phase"] is None
        assert ask(server)
        assert "warming up" not in server.log_text() and "warmed up" not in server.log_text()
    finally:
        stop(server)


def test_warmup_auto_on_cpu_skips_it(server):
    # the session's server runs with the default, --warmup auto
    assert server.health()["phase"] is None
    assert "warming up" not in server.log_text()


def test_launch_shows_the_warm_up_as_a_step_of_its_progress(hf_home, tmp_path):
    """`launch --warmup on` starts its server with it, and its spinner (rendered: rich is
    told the captured stderr is an interactive terminal) shows the warm-up steps, never
    "serving" before the server is ready."""
    home = tmp_path / "home"
    home.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pi").write_text("#!/bin/sh\necho pi-ran\n")  # a stand-in agent: only runs
    (bindir / "pi").chmod(0o755)
    url = f"http://127.0.0.1:{free_port()}"
    env = clean_env(home, hf_home, PATH=f"{bindir}:/usr/bin:/bin", TTY_COMPATIBLE="1",
                    TTY_INTERACTIVE="1", COLUMNS="200")
    try:
        r = subprocess.run([sys.executable, "-m", "kit", "launch", "pi", "--url", url,
                            "--warmup", "on", "--timeout", "240"], env=env, cwd=home,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip() == "pi-ran"
        # the spinner's text: "server <status>[, <phase>]: <the server's last log line>"
        steps = re.findall(r"server ([^\r\n\x1b]*)", r.stderr)
        warming = [i for i, s in enumerate(steps) if s.startswith("loading, warming up: ")]
        assert warming, steps
        assert any(steps[i].endswith("warming up: batch x8 (15 of 15)")  # max-batch 8
                   for i in warming), steps
        assert not any("serving" in s for s in steps[:warming[-1]]), steps
        assert "started mlx-kit server" in r.stderr
    finally:
        run_kit(clean_env(home, hf_home), "stop", "--url", url, timeout=60)


def test_serve_refuses_warmup_on_with_ranks_before_any_rank_starts(tmp_path):
    r = run_kit(tmp_path, "serve", "--ranks", "2", "--warmup", "on",
                "--port", str(free_port()), timeout=60)
    assert r.returncode == 1, r.stderr  # a ConfigError, as plan_world's
    assert "--warmup on does not work with --ranks" in flat(r.stderr)
    assert "starting 2 ranks" not in r.stderr
