"""Give memory back to the system after a large request.

Freed memory does not leave the process by itself: mlx keeps freed buffers in its cache
for reuse, and glibc's malloc keeps freed heap pages (its mmap threshold grows with every
large block freed, so the next large strings and lists land on the heap too). After one
multi-megabyte prompt the engine's RSS stayed GBs above its level before. ``gc.collect``
frees cycles, ``mx.clear_cache`` empties mlx's cache, and glibc's ``malloc_trim(0)``
(called through ctypes: no library wraps it) returns free pages of every arena, the
tokenizer's Rust allocations included, which use the same malloc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys

log = logging.getLogger("mlx_kit.engine")

LARGE_BYTES = 1 << 20
"""A request whose prompt text is at least this long (characters) is followed by
:func:`give_back`."""

_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet


def _malloc_trim() -> bool:
    global _libc
    if _libc is False:
        name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
        try:
            _libc = ctypes.CDLL(name) if name else None
            if _libc is not None and not hasattr(_libc, "malloc_trim"):  # musl
                _libc = None
        except OSError:
            _libc = None
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True


def give_back(mlx_cache: bool = True) -> None:
    """Collect garbage, empty mlx's buffer cache (if mlx is loaded and ``mlx_cache``;
    only the worker that runs the model should) and trim the C heap (glibc only).
    Takes milliseconds; call it when idle."""
    gc.collect()
    if mlx_cache and "mlx.core" in sys.modules:
        sys.modules["mlx.core"].clear_cache()
    trimmed = _malloc_trim()
    log.debug("gave memory back (malloc_trim: %s)", trimmed)
