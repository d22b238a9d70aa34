"""Benchmark: what proving a prompt cache file ours costs per disk hit (kit/engine/cache/cache_mac.py).

For each file size, one real prompt cache file written by the disk tier
(``DiskCache.save``: mlx-lm's ``save_prompt_cache`` plus the seal), holding float16 KV of
the shape a 7B-class model's layers have (32 layers, 8 KV heads, head dim 128: 128 KiB per
token), in a throwaway folder, read warm (from the page cache, as the second of two reads
is). Timed, best of ``--repeat``:

- ``check``: the MAC over the whole file (``cache_mac.check``: HMAC-SHA256, 1 MiB reads);
- ``load``: what a hit costs without it (``load_prompt_cache`` + ``mx.eval`` of the
  tensors, as ``DiskCache.load`` does);
- ``hit``: ``DiskCache.load`` as it runs now (ownership, MAC, load, checks).

A write's seal is one more such pass (on idle time: no request waits for it).

Prints ms per GB (10^9 bytes) and the MAC's share of a hit. A cold read (from the disk,
not the page cache) adds the same read time to both the load and the check.

Usage: python bench/cache_mac.py [--sizes-mb 64,256,1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

LAYERS, HEADS, DIM = 32, 8, 128


def cache_of(tokens: int):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    caches = [KVCache() for _ in range(LAYERS)]
    for c in caches:
        x = mx.random.normal((1, HEADS, tokens, DIM)).astype(mx.float16)
        c.update_and_fetch(x, x)
    mx.eval([c.state for c in caches])
    return caches


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="64,256,1024")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    from kit.engine.cache import cache_mac
    from kit.engine.cache.disk_cache import DiskCache

    ident = "0123456789abcdef" * 2
    layers = ("KVCache",) * LAYERS
    per_token = LAYERS * 2 * HEADS * DIM * 2  # K and V, float16
    print("| file MB | tokens | check ms | load ms | hit ms | check ms/GB | MAC / hit |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        key = os.urandom(32)
        for mb in (int(x) for x in args.sizes_mb.split(",")):
            root = Path(tmp) / f"c{mb}"
            # whole 256-token steps, as mlx-lm allocates (the file holds the buffer)
            tokens = max(256, (mb * 10**6 // per_token) // 256 * 256)
            toks = list(range(tokens))
            disk = DiskCache(root, 1 << 40, key=key)
            cache = cache_of(tokens)
            assert disk.save(ident, toks, cache, trimmable=True)
            del cache
            found = disk.find(ident, toks, layers, True)
            path = found.entry.path
            size = path.stat().st_size

            def check():
                with open(path, "rb") as f:
                    cache_mac.check(f, key)

            def load():
                c = load_prompt_cache(str(path))
                mx.eval([x.state for x in c])

            def hit():
                assert disk.load(ident, found.entry, layers) is not None

            check()  # into the page cache
            c_s, l_s, h_s = (best(f, args.repeat) for f in (check, load, hit))
            gb = size / 1e9
            print(f"| {size / 1e6:.0f} | {tokens} | {c_s * 1e3:.0f} | {l_s * 1e3:.0f} | "
                  f"{h_s * 1e3:.0f} | {c_s * 1e3 / gb:.0f} | {c_s / h_s:.2f} |")


if __name__ == "__main__":
    main()
