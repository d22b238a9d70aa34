"""How long an open stream stalls while the server rescans the model catalog.

Builds a hub cache with the starter plus ``--models`` fake models whose tokenizer.json is
``--tokenizer-mb`` MB (one file hard-linked into every snapshot, so little disk is used;
real vocabularies make 10-30 MB files), starts ``mlx-kit serve`` on it, and streams
``--tokens`` tokens while another client reads /v1/models every second (each read after
the 10 s snapshot age starts a rescan). Prints the scan's own duration, the gaps between
streamed tokens and the slowest /v1/models answer.

``--code DIR`` runs another checkout's kit (e.g. an export of an older commit) for a
before/after table: ``git archive main | tar -x -C /tmp/old``, then
``python bench/catalog_stall.py --code /tmp/old``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402


def fake_cache(hub: Path, models: int, tokenizer_mb: int) -> None:
    """``models`` loadable-looking models (config, empty weights, a big tokenizer.json)."""
    big = hub / "big-tokenizer.json"
    vocab = {f"tok{i:07d}": i for i in range(tokenizer_mb * 1024 * 1024 // 20)}
    big.write_text(json.dumps({"version": "1.0", "added_tokens": [
        {"id": 0, "content": "<|im_start|>", "special": True}], "normalizer": None,
        "model": {"type": "BPE", "vocab": vocab}}))
    for n in range(models):
        repo = hub / f"models--fake--model-{n:04d}"
        snap = repo / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
        (snap / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "max_position_embeddings": 4096}))
        (snap / "model.safetensors").write_bytes(b"")
        os.link(big, snap / "tokenizer.json")
    big.unlink()


def run(code: Path, hf_home: Path, tokens: int) -> dict:
    env = {**bench_env(Path(tempfile.mkdtemp(prefix="bench-home-"))), "HF_HOME": str(hf_home),
           "PYTHONPATH": str(code)}
    scan = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter();"
                           "from kit.models.catalog import scan; n = len(scan());"
                           "print(time.perf_counter() - t)"], env=env, cwd=code, check=True,
                          capture_output=True, text=True)
    port = free_port()
    log = hf_home.parent / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--temperature", "0", "--log-file", str(log)],
                                env=env, cwd=code, stdout=out, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_ready(root + "/health", proc)
        done = threading.Event()
        lists: list[float] = []

        def reader() -> None:
            while not done.is_set():
                t = time.perf_counter()
                httpx.get(root + "/v1/models", timeout=600)
                lists.append(time.perf_counter() - t)
                done.wait(1.0)

        arrivals: list[float] = []
        threading.Thread(target=reader, daemon=True).start()
        with httpx.stream("POST", root + "/v1/chat/completions", timeout=600, json={
                "model": "local", "max_tokens": tokens, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.perf_counter())
        done.set()
    finally:
        proc.terminate()
        proc.wait(30)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"scan_s": float(scan.stdout.strip()), "chunks": len(arrivals),
            "stream_s": arrivals[-1] - arrivals[0], "gap_max_s": max(gaps),
            "gap_median_s": statistics.median(gaps), "models_max_s": max(lists),
            "models_reads": len(lists)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--tokenizer-mb", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--code", type=Path, action="append",
                        help="a checkout to run (repeatable; default: this one)")
    args = parser.parse_args()
    codes = args.code or [Path(__file__).resolve().parent.parent]
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        hf_home = Path(tmp) / "hf"
        env = {**bench_env(Path(tmp) / "home"), "HF_HOME": str(hf_home)}
        starter(env)
        fake_cache(hf_home / "hub", args.models, args.tokenizer_mb)
        print(f"{args.models} fake models, tokenizer.json {args.tokenizer_mb} MB each, "
              f"{args.tokens} tokens streamed, /v1/models read every 1 s")
        print(f"{'code':40} {'scan s':>7} {'stream s':>8} {'gap max s':>9} "
              f"{'gap p50 s':>9} {'/v1/models max s':>16}")
        for code in codes:
            r = run(code.resolve(), hf_home, args.tokens)
            print(f"{str(code)[-40:]:40} {r['scan_s']:7.2f} {r['stream_s']:8.1f} "
                  f"{r['gap_max_s']:9.3f} {r['gap_median_s']:9.3f} {r['models_max_s']:16.3f}")


if __name__ == "__main__":
    main()
