"""How ``serve --embed-model`` starts the embedding model beside the chat model, and what
it leaves the chat model of the memory ceiling."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from kit.embed.process import EmbedProcess
from kit.errors import ConfigError, ModelError
from kit.models.memory import memory_ceiling
from kit.models.resolve import resolve_model

#: seconds ``serve`` waits for the embedding model before it gives up
LOAD_TIMEOUT_S = 300.0


def start_embedder(spec: str, budget: int | None,
                   progress: Callable[[str], None]) -> tuple[EmbedProcess, int | None]:
    """Resolve ``spec`` (a folder or a hub id in the local cache), start its process and
    wait for its load, before the chat model starts: a bad path or a model mlx-embeddings
    cannot load stops the start-up with its reason, and the chat model's fit check then
    counts what the embedding model took.

    Returns:
        the running process, and the memory budget (bytes) for the chat engine: the
        ceiling less the embedding weights where the ceiling is fixed (``--memory-budget``,
        Metal's working set); ``budget`` as given where it is the memory available now
        (the embedding process's memory is no longer available by then).

    Raises:
        ConfigError: mlx-embeddings is not installed.
        ModelNotFoundError, InvalidModelSpec: see :func:`kit.models.resolve.resolve_model`.
        ModelError: the model did not load (its reason), or not within the timeout.
    """
    if importlib.util.find_spec("mlx_embeddings") is None:
        raise ConfigError("--embed-model needs mlx-embeddings, which is not installed",
                          hint="pip install 'mlx-kit[embeddings]' (mlx-embeddings is GPLv3; "
                               "mlx-kit is MIT, so it is an extra you choose)")
    info = resolve_model(spec, progress=progress)
    embedder = EmbedProcess(info)
    progress(f"loading the embedding model {info.id} as 'local-embed'")
    embedder.start()
    if not embedder.wait_ready(LOAD_TIMEOUT_S):
        why = embedder.error or f"not loaded within {LOAD_TIMEOUT_S:.0f} s"
        embedder.stop()
        raise ModelError(f"the embedding model {info.id} did not load: {why}")
    ceiling = memory_ceiling(budget)
    if ceiling.source == "available":
        return embedder, budget
    return embedder, max(0, ceiling.bytes - (embedder.weights_bytes or 0))
