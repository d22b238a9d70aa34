"""``pull``: download a model into the standard Hugging Face cache (huggingface_hub; its
downloads resume where they stopped). The starter ids are built locally instead.

What went wrong is read from huggingface_hub's typed errors (and the HTTP library's
transport errors they wrap), never from message text."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from kit.errors import ConfigError, ModelError, ModelNotFoundError
from kit.models.starter import STARTER_VARIANTS, Progress, ensure_starter, no_progress

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_LOGIN = "log in with `hf auth login` (or set HF_TOKEN)"


def pull(repo_id: str, progress: Progress = no_progress) -> Path:
    """Make ``repo_id`` available in the local hub cache and return its snapshot folder.

    Raises:
        ConfigError: ``repo_id`` is not ``ORG/NAME``.
        ModelNotFoundError: the hub has no such repo (or it is private and we have no token).
        ModelError: the repo is gated, the hub cannot be reached (offline, HF_HUB_OFFLINE,
            a connection error or timeout) or answered with an error; one line each.
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
        raise download_error(repo_id, e) from None


def download_error(repo_id: str, error: BaseException) -> ModelError:
    """The one-line error for a failed download of ``repo_id``, by the type of ``error``
    (and of what it wraps: huggingface_hub wraps a connection failure in a
    ``LocalEntryNotFoundError`` when nothing is cached)."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(error, GatedRepoError):  # (a RepositoryNotFoundError too: test it first)
        return ModelError(f"cannot download {repo_id}: the repo is gated",
                          hint=f"accept its terms on https://huggingface.co/{repo_id}, then "
                               + _LOGIN)
    if isinstance(error, RepositoryNotFoundError):
        missing = ModelNotFoundError(repo_id, [])
        missing.hint = "no repo by that name on the Hugging Face hub; a private one needs " \
                       "a token: " + _LOGIN
        return missing
    if _unreachable(error):
        return ModelError(f"cannot download {repo_id}: the Hugging Face hub is not reachable",
                          hint="check the network (or HF_ENDPOINT / HF_HUB_OFFLINE); a partial "
                               "download resumes on the next pull")
    http = _wrapped(error, HfHubHTTPError)
    if http is not None and http.response is not None:
        return ModelError(f"cannot download {repo_id}: the hub answered HTTP "
                          f"{http.response.status_code}", hint="try again later")
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return ModelError(f"cannot download {repo_id}: {reason}")


def _chain(error: BaseException | None):
    """``error`` and the exceptions it wraps (``__cause__``/``__context__``), at most 10."""
    for _ in range(10):
        if error is None:
            return
        yield error
        error = error.__cause__ or error.__context__


def _wrapped(error: BaseException, kind: type) -> BaseException | None:
    return next((e for e in _chain(error) if isinstance(e, kind)), None)


def _unreachable(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) says the hub cannot be reached: offline mode
    (``OfflineModeIsEnabled`` is a ``ConnectionError``), a connection error or a timeout of
    the HTTP library huggingface_hub uses (httpx, httpx2 or requests, whichever it loaded)."""
    kinds: list[type] = [ConnectionError, TimeoutError]
    for module, names in (("httpx", ("TransportError",)), ("httpx2", ("TransportError",)),
                          ("requests", ("ConnectionError", "Timeout"))):
        loaded = sys.modules.get(module)  # only a library that is in use can have raised
        kinds += [getattr(loaded, n) for n in names if hasattr(loaded, n)]
    return _wrapped(error, tuple(kinds)) is not None
