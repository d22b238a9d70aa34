"""The engine: the only code that calls mlx / mlx-lm for generation.

It owns the model on one worker loop (in the server: in its own process, see
:mod:`kit.engine.proc.process`), queues requests, applies the chat template, reuses
the longest cached prompt prefix (mlx-lm's ``LRUPromptCache``), and yields one typed event
stream per request (:mod:`kit.engine.types`). It knows nothing about HTTP.

What the server may rely on is :class:`kit.engine.interface.EngineLike`, which the
in-process :class:`kit.engine.decode.engine.Engine` and :class:`kit.engine.proc.process.EngineProcess`
both satisfy.

Nothing here imports mlx at module import time: ``Engine.start()`` does, on its thread.
"""

from kit.engine.types import (
    ChatRequest,
    EngineError,
    Event,
    Finished,
    InvalidRequest,
    ModelUnavailable,
    ReasoningDelta,
    SamplingParams,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCall,
    Usage,
)

__all__ = [
    "ChatRequest",
    "EngineError",
    "Event",
    "Finished",
    "InvalidRequest",
    "ModelUnavailable",
    "ReasoningDelta",
    "SamplingParams",
    "Started",
    "TextDelta",
    "TokenLogprob",
    "ToolCall",
    "Usage",
]
