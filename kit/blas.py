"""Use an optimized BLAS for mlx on Linux CPU.

mlx's Linux CPU wheel bundles a reference (netlib) BLAS, ~60x slower than OpenBLAS for the
float32 matmuls of prefill (measured here: 512x576x1536 takes 150 ms bundled, 4.4 ms with
OpenBLAS). Loading the system's OpenBLAS with ``RTLD_GLOBAL`` *before* mlx is imported makes
its ``sgemm``/``cblas_*`` symbols win over the bundled ones for the whole process.

``MLX_KIT_BLAS`` selects: ``auto`` (default: the first OpenBLAS found), ``off``, or a path.
No library does this preloading, so it is our own code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

from kit.knobs import env

ENV = "MLX_KIT_BLAS"
#: What OpenBLAS buys, as ``doctor`` tells a user without it (the measurement above)
SPEEDUP = "prefill's float32 matmuls ~34x faster (512x576x1536: 150 ms bundled, 4.4 ms)"
#: The Debian/Ubuntu package of the OpenBLAS this module looks for first
PACKAGE = "libopenblas0-pthread"
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_loaded: str | None = None
_done = False


def preload_blas() -> str | None:
    """Load an optimized BLAS globally, once per process, before mlx is imported.

    Returns:
        The path of the library loaded, or None (not Linux, turned off, none found, or mlx
        was already imported so it would have no effect).
    """
    global _loaded, _done
    if _done:
        return _loaded
    _done = True
    choice = (env(ENV) or "auto").strip()
    if not sys.platform.startswith("linux") or choice.lower() in ("off", "0", "none", ""):
        return None
    if "mlx.core" in sys.modules:
        return None
    paths = [choice] if choice.lower() != "auto" else [
        *_CANDIDATES, *(filter(None, [ctypes.util.find_library("openblas")]))
    ]
    for p in paths:
        if "/" in p and not Path(p).exists():
            continue
        try:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _loaded = p
        return p
    return None


#: OpenBLAS's and OpenMP's thread-count variables, read once when the library loads
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def share_cores(ranks_here: int) -> int | None:
    """Give each of ``ranks_here`` processes of one world on this host its share of the
    cores this process may run on, as OpenBLAS's thread count; call it before
    :func:`preload_blas`. torchrun does the same (``OMP_NUM_THREADS=1`` for several
    processes per node): OpenBLAS's threads busy-wait after each call, so three ranks with
    a pool of every core each fight for the cores (measured on 2 cores: 3 ranks decoded 24
    tokens in 45 s with the default pools, 27 s with one thread each).

    Returns:
        The thread count set, or None: one rank here, or the user set either variable
        (theirs is kept).
    """
    if ranks_here <= 1 or any(v in os.environ for v in THREAD_VARIABLES):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // ranks_here)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    return threads
