"""A rank's failed check (``World.agree``) as a :class:`kit.engine.distributed.world_codec.Fault` and
back: the error's kind (``kit.errors.error_kind``), message, hint and the few typed
fields the server's answers read, never the exception object itself. Pure Python."""

from __future__ import annotations

from kit.engine.distributed.world_codec import Fault
from kit.errors import (
    KitError,
    ModelDoesNotFitError,
    ModelError,
    error_class_of_kind,
    error_kind,
)

_TEXT = 16 << 10  # characters of a message or hint that cross; a load error's is a line


def fault_of(error: BaseException, host: str) -> Fault:
    """``error`` of this rank (on ``host``) as a Fault. Not a :class:`KitError`: a
    ModelError of its text (an arbitrary exception's fields cannot cross)."""
    if not isinstance(error, KitError):
        error = ModelError(f"{type(error).__name__}: {error}" if not str(error)
                           else str(error))
    fields = {name: getattr(error, name, None) for name in ("code", "field", "needed", "budget")}
    return Fault(kind=error_kind(error), message=str(error.message)[:_TEXT],
                 hint=None if error.hint is None else str(error.hint)[:_TEXT], host=host[:4096],
                 **{k: v for k, v in fields.items()
                    if isinstance(v, int if k in ("needed", "budget") else str)
                    and not isinstance(v, bool)})


def error_of(fault: Fault, rank: int) -> KitError:
    """The error rank ``rank`` shared as ``fault``: its kind (the HTTP status and the CLI's
    exit code follow it), the message prefixed with the rank and host."""
    cls = error_class_of_kind(fault.kind) or ModelError
    error = cls.__new__(cls)
    message = f"rank {rank} ({fault.host}): {fault.message}"
    Exception.__init__(error, message)
    error.message, error.hint = message, fault.hint
    error.code, error.field = fault.code, fault.field
    if issubclass(cls, ModelDoesNotFitError):
        error.needed, error.budget = fault.needed or 0, fault.budget or 0
    return error
