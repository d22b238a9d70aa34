"""The Hugging Face cache's side of ``doctor``: where models go, the free space there,
and whether the starter model (what ``launch`` serves by default) is built."""

from __future__ import annotations

import shutil
from pathlib import Path

from kit.doctor.check import Check
from kit.models.memory import human
from kit.models.starter import STARTER_ID, hub_cache_dir, starter_path

GIB = 2**30
#: Below this much free space a first launch cannot build the starter (its float32
#: weights are 538 MB, plus the 4-bit source while converting)
FAIL_BELOW = 1 * GIB
#: Below this, the starter fits but a real model (a 7B at 4 bits is ~4.5 GB) would not
WARN_BELOW = 10 * GIB


def _existing(path: Path) -> Path:
    """``path``, or its nearest folder that exists (a fresh HOME has no cache yet)."""
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def cache_checks() -> list[Check]:
    """The ``hf cache`` line (path, free space) and the ``starter`` line."""

    cache = hub_cache_dir()
    try:
        free = shutil.disk_usage(_existing(cache)).free
    except OSError as e:
        checks = [Check("cache", "hf cache", "warn", f"{cache}: cannot read its disk "
                        f"({e.strerror})", "check that the folder is readable (HF_HUB_CACHE "
                        "or HF_HOME move it)", {"path": str(cache), "free_bytes": None})]
    else:
        data = {"path": str(cache), "free_bytes": free, "exists": cache.is_dir()}
        detail = f"{cache}: {human(free)} free" + ("" if cache.is_dir() else
                                                   " (not created yet)")
        fix = ("free disk space, or move the cache to a larger disk: export "
               "HF_HUB_CACHE=/path/on/a/larger/disk")
        status = "fail" if free < FAIL_BELOW else "warn" if free < WARN_BELOW else "ok"
        checks = [Check("cache", "hf cache", status, detail,
                        None if status == "ok" else fix, data)]
    path = starter_path(STARTER_ID)
    if path is not None:
        checks.append(Check("cache", "starter", "ok", f"{STARTER_ID} built ({path})",
                            data={"model": STARTER_ID, "path": str(path), "built": True}))
    else:
        checks.append(Check("cache", "starter", "ok", f"{STARTER_ID} not built yet (the first "
                            "launch builds it, ~5-30 s; or: mlx-kit pull " + STARTER_ID + ")",
                            data={"model": STARTER_ID, "path": None, "built": False}))
    return checks
