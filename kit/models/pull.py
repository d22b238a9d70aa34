"""``pull``: download a model into the standard Hugging Face cache (huggingface_hub; its
downloads resume where they stopped). The starter ids are built locally instead."""

from __future__ import annotations

import re
from pathlib import Path

from kit.errors import ConfigError, ModelError
from kit.models.starter import STARTER_VARIANTS, Progress, ensure_starter, no_progress

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def pull(repo_id: str, progress: Progress = no_progress) -> Path:
    """Make ``repo_id`` available in the local hub cache and return its snapshot folder.

    Raises:
        ConfigError: ``repo_id`` is not ``ORG/NAME``.
        ModelError: the hub cannot be reached or has no such repo (one line, no traceback).
    """
    if repo_id in STARTER_VARIANTS:
        return ensure_starter(progress, repo_id)
    if not _REPO_ID.match(repo_id):
        raise ConfigError(f"not a Hugging Face repo id: {repo_id!r}", hint="use ORG/NAME, e.g. "
                          "mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    from huggingface_hub import snapshot_download

    progress(f"downloading {repo_id} into the Hugging Face cache")
    try:
        return Path(snapshot_download(repo_id))
    except Exception as e:  # huggingface_hub raises many kinds; each becomes one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        name = type(e).__name__
        offline = any(k in name + reason for k in ("Offline", "LocalEntryNotFound", "Connect",
                                                   "connection", "resolve", "Timeout"))
        raise ModelError(
            f"cannot download {repo_id}: " + ("the Hugging Face hub is not reachable"
                                              if offline else reason),
            hint="check the network (or HF_ENDPOINT / HF_HUB_OFFLINE); a partial download "
                 "resumes on the next pull" if offline else None) from None
