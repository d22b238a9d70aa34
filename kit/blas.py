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
    for p in _paths(choice):
        try:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _loaded = p
        return p
    return None


def _paths(choice: str) -> list[str]:
    """The libraries to try for ``MLX_KIT_BLAS=choice`` (a path, or ``auto``), those named
    by a path that does not exist left out."""
    paths = [choice] if choice.lower() != "auto" else [
        *_CANDIDATES, *(filter(None, [ctypes.util.find_library("openblas")]))
    ]
    return [p for p in paths if "/" not in p or Path(p).exists()]


def _cuda_build() -> bool:
    """Whether mlx's CUDA backend is installed (``mlx[cuda]``: a ``mlx-cuda*``
    distribution); its models run on the GPU, where this BLAS plays no part."""
    from importlib.metadata import distributions

    return any((d.metadata["Name"] or "").lower().replace("_", "-").startswith("mlx-cuda")
               for d in distributions())


def missing_blas_note() -> str | None:
    """What a user of mlx's Linux CPU build should hear before a first long prefill when
    no OpenBLAS will load (``MLX_KIT_BLAS`` auto and none found, or its path missing), or
    None: not Linux, the CUDA build, ``MLX_KIT_BLAS=off`` (their choice), or one found.
    Checks files only: no mlx import, no library loaded (``launch`` calls it)."""
    choice = (env(ENV) or "auto").strip()
    if not sys.platform.startswith("linux") or choice.lower() in ("off", "0", "none", ""):
        return None
    if _paths(choice) or _cuda_build():
        return None
    what = "no OpenBLAS found" if choice.lower() == "auto" else f"{ENV}={choice} does not exist"
    return (f"{what}: prompt processing (prefill) on this CPU uses mlx's bundled reference "
            f"BLAS. Install OpenBLAS (`sudo apt-get install {PACKAGE}`; mlx-kit loads it by "
            f"itself): {SPEEDUP}")


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
