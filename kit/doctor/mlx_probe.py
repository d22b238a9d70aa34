"""``python -m kit.doctor.mlx_probe``: import mlx as the server's engine does (OpenBLAS
preloaded first, :func:`kit.blas.preload_blas`), run one tiny computation on its default
device and print one JSON object on stdout. ``doctor`` runs it in a child process, so
that an mlx that crashes, hangs or fails to import cannot take doctor down with it.

Printed keys: ``mlx`` (its version), ``device`` (``cpu``/``gpu``), ``metal``, ``cuda``
(bools), ``working_set``/``memory_size`` (bytes, Metal only), ``blas`` (the library
preloaded, or null), ``blas_setting`` (``MLX_KIT_BLAS``: ``auto``, ``off`` or a path),
``computed`` (the computation's result was right).
"""

from __future__ import annotations

import json
import sys

from kit.blas import ENV, preload_blas
from kit.knobs import env


def main() -> None:
    """Probe mlx and print the JSON object (an import error propagates: exit 1, its
    traceback on stderr, which the parent reads)."""
    blas = preload_blas()
    import mlx.core as mx

    info: dict = {}
    metal = bool(mx.metal.is_available())
    if metal:
        query = getattr(mx, "device_info", None) or mx.metal.device_info
        info = dict(query())
    cuda = bool(getattr(mx, "cuda", None) and mx.cuda.is_available())
    a = mx.ones((4, 4))
    computed = float(mx.sum(a @ a).item()) == 64.0  # the device really computes
    print(json.dumps({
        "mlx": getattr(mx, "__version__", None), "device": mx.default_device().type.name,
        "metal": metal, "cuda": cuda,
        "working_set": info.get("max_recommended_working_set_size"),
        "memory_size": info.get("memory_size"), "blas": blas,
        "blas_setting": (env(ENV) or "auto").strip(), "computed": computed,
        "platform": sys.platform}))


if __name__ == "__main__":
    main()
