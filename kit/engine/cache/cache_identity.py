"""What a prompt cache file is for: the model identity it is filed under, whether its
layers fit a model's, how much of a prompt it holds (:mod:`kit.engine.cache.disk_cache`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

FORMAT = "2"  #: bumped when what a file means changes; other formats are deleted


def model_identity(folder: Path, kv_bits: int | None, kv_group_size: int) -> str:
    """A 32-hex-digit name for a model's KV caches: it changes when the model's files or
    the KV settings change, so a cache is only ever loaded into the model that made it.

    Hashes the resolved folder, config.json's bytes, every top-level file's name, size
    and mtime_ns (weights, tokenizer; symlinks of the hub cache followed), ``kv_bits``,
    ``kv_group_size``, mlx-lm's version and mlx's (the quantized KV layout is mlx's).

    Raises:
        OSError: the folder cannot be read.
    """
    from importlib.metadata import PackageNotFoundError, version

    root = Path(folder).resolve()
    h = hashlib.sha256()
    h.update(f"format {FORMAT}\n{root}\n".encode())
    try:
        h.update((root / "config.json").read_bytes())
    except FileNotFoundError:
        pass
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_file():  # follows symlinks (the hub cache's blobs)
            st = entry.stat()
            h.update(f"\n{entry.name} {st.st_size} {st.st_mtime_ns}".encode())
    h.update(f"\nkv {kv_bits} {kv_group_size}".encode())
    for package in ("mlx-lm", "mlx"):
        try:
            v = version(package)
        except PackageNotFoundError:
            v = "unknown"
        h.update(f"\n{package} {v}".encode())
    return h.hexdigest()[:32]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two int32 arrays share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def classes_fit(stored: tuple[str, ...], expected: tuple[str, ...]) -> bool:
    """Whether a stored cache's layer classes can stand in for ``make_prompt_cache``'s:
    the same, layer by layer, except that a ``KVCache`` layer may have been quantized
    (``QuantizedKVCache``) once the prompt passed ``--kv-bits``'s start."""
    return len(stored) == len(expected) and all(
        s == e or (e == "KVCache" and s == "QuantizedKVCache")
        for s, e in zip(stored, expected))
