"""The one error tree of mlx-kit.

    KitError                      expected failure: one line for the user + an optional hint
    ├── ConfigError               bad user input (flags, URLs, config files)
    ├── ModelError                a model cannot be found, converted or loaded
    │   ├── ModelNotFoundError    an id that names no model we can serve
    │   ├── InvalidModelSpec      a name or folder that cannot be a model (models/resolve.py)
    │   └── ModelDoesNotFitError  weights + KV cache exceed the memory budget (exit 5)
    ├── EngineError               generation failed inside the engine
    │   ├── InvalidRequest        the request cannot run as given (a neutral ``field``)
    │   ├── ModelUnavailable      the request names a model that is not the loaded one
    │   ├── ModelLoadError        the model failed to load or reload
    │   └── EngineUnavailable     the engine process is gone, restarting or stopping
    ├── ServerError               the server cannot be reached, started or stopped
    │   ├── ServerNotRunningError no mlx-kit server answers at the URL (exit 3)
    │   └── PortInUseError        something that is not mlx-kit holds the port
    ├── HarnessError              an agent cannot be configured or removed
    │   └── EditedFileError       a file we wrote was edited since (harness/plan.py)
    └── AgentNotInstalledError    the agent's binary is not on PATH

Each protocol maps a cause to its HTTP status and error shape through one table
(``kit.server.errors.api_error``), by type, never by message text.
The CLI prints a KitError as ``error: <message>`` (+ ``hint: <hint>``) and exits with its
``exit_code`` (1 unless the class says more); any other exception is unexpected and is
reported with the path of a log file (exit 70). :class:`ExitCode` is the one table of the
CLI's exit codes.
"""

from __future__ import annotations

import re
from enum import IntEnum


class ExitCode(IntEnum):
    """The exit codes of every ``mlx-kit`` command (printed by ``mlx-kit --help``, listed
    in docs/cli.md). ``kit.cli.main`` maps errors to them in one place.

    2 is click's usage error; 3 "not running" follows LSB/systemctl ``status``; 70 is
    sysexits' EX_SOFTWARE; 130 is the shell's 128 + SIGINT; 141 the shell's 128 + SIGPIPE
    (what ``git log | head`` leaves in ``$?``: git dies of SIGPIPE, Python ignores it).
    """

    OK = 0
    ERROR = 1          # an expected error (a bad size, URL...): `error: ...`, `hint: ...`
    USAGE = 2          # click's usage errors: unknown flag, missing argument, not an int
    NO_SERVER = 3      # no mlx-kit server answers at the URL
    NOT_READY = 4      # `status`: the server answers but is loading, restarting or stopping
    DOES_NOT_FIT = 5   # the model does not fit the memory budget (`fit`, `serve`)
    SOFTWARE = 70      # an unexpected error (a bug): the message names a log with the traceback
    INTERRUPTED = 130  # Ctrl-C
    BROKEN_PIPE = 141  # stdout's reader left (`| head`): silent, the shell's 128 + SIGPIPE


#: (code, meaning) for help texts and docs, in :class:`ExitCode` order.
EXIT_CODE_MEANINGS: tuple[tuple[int, str], ...] = (
    (ExitCode.OK, "success"),
    (ExitCode.ERROR, "expected error, a flag value mlx-kit checks included (the message "
                     "says what and the hint what to do)"),
    (ExitCode.USAGE, "usage error (click's): an unknown flag, a missing argument, a value "
                     "not of the flag's type or range"),
    (ExitCode.NO_SERVER, "no mlx-kit server is running at the URL"),
    (ExitCode.NOT_READY, "status: the server is loading, restarting or stopping"),
    (ExitCode.DOES_NOT_FIT, "the model does not fit in memory"),
    (ExitCode.SOFTWARE, "unexpected error (a bug): the message names a log file"),
    (ExitCode.INTERRUPTED, "interrupted (Ctrl-C)"),
    (ExitCode.BROKEN_PIPE, "stdout's reader left early (e.g. head): silent, as git and "
                           "ls"),
)


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


def reduce_error(error: BaseException) -> tuple:
    """``__reduce__`` for exceptions whose ``__init__`` does not take ``self.args`` back
    (keyword fields, formatted messages): rebuilt from args and attributes, so a copy
    (``copy.copy``, ``deepcopy``) keeps them. Between processes they cross as typed
    records instead (:mod:`kit.engine.proc.wire`), never pickles."""
    return _rebuild, (type(error), error.args, dict(error.__dict__))


class KitError(Exception):
    """An expected failure with a message meant for the user.

    Args:
        message: one line saying what went wrong.
        hint: optional one line saying how to fix it.

    ``exit_code`` (class attribute, an :class:`ExitCode`) is the CLI's exit status for it.
    """

    exit_code: int = ExitCode.ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    __reduce__ = reduce_error


def error_kind(error: BaseException) -> str:
    """The snake-case kind of an error, as /health's ``error_type`` reports it: the class
    name without ``Error`` (``ModelDoesNotFitError`` -> ``"model_does_not_fit"``)."""
    return _kind(type(error).__name__)


def _kind(name: str) -> str:
    name = name[:-len("Error")] if name.endswith("Error") and name != "Error" else name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def error_class_of_kind(kind: str | None) -> type[KitError] | None:
    """The :class:`KitError` subclass whose :func:`error_kind` a server reported (its
    ``exit_code`` is the CLI's for it); None for None or a kind that is not one of ours."""
    todo: list[type[KitError]] = [KitError]
    while kind is not None and todo:
        cls = todo.pop()
        if _kind(cls.__name__) == kind:
            return cls
        todo.extend(cls.__subclasses__())
    return None


class ConfigError(KitError):
    """Bad user input: a flag, a URL, a config file we cannot read."""


class ModelError(KitError):
    """A model cannot be found, converted or loaded."""


class ModelNotFoundError(ModelError):
    """A model id names no model we can serve. ``available`` lists those we can."""

    def __init__(self, model: str, available: list[str]) -> None:
        super().__init__(
            f"model {model!r} not found",
            hint="available: " + ", ".join(available) if available else None,
        )
        self.model = model
        self.available = available


class ModelDoesNotFitError(ModelError):
    """A model's estimated memory (weights + KV cache for its context window) exceeds the
    budget. ``needed`` and ``budget`` are bytes."""

    exit_code = ExitCode.DOES_NOT_FIT

    def __init__(self, message: str, hint: str | None = None, *, needed: int = 0,
                 budget: int = 0) -> None:
        super().__init__(message, hint)
        self.needed, self.budget = needed, budget


class ServerError(KitError):
    """The server cannot be reached, started or stopped."""


class ServerNotRunningError(ServerError):
    """No mlx-kit server answers at the URL a command needs one at (exit 3)."""

    exit_code = ExitCode.NO_SERVER


class PortInUseError(ServerError):
    """Something that is not an mlx-kit server answers on the configured address."""


class HarnessError(KitError):
    """An agent cannot be configured or its configuration removed."""


class AgentNotInstalledError(KitError):
    """The agent's binary is not on PATH; ``hint`` holds the exact install command."""


class EngineError(KitError):
    """A generation or engine call failed inside the engine: an internal error (HTTP 500)
    unless a subclass says more. Raised by ``kit.engine`` and re-raised on the server's
    side of the engine process's pipe as the same class with the same attributes (it
    crosses as a typed record, :mod:`kit.engine.proc.wire`, never a pickle)."""


class InvalidRequest(EngineError):
    """The request cannot be run as given (HTTP 400).

    Attributes:
        code: machine-readable code, e.g. ``context_length_exceeded``.
        field: the request part at fault, in the engine's protocol-neutral words, each
            protocol maps it to its own field name: ``messages``, ``prompt``, ``tools``,
            ``tool_choice``, ``schema`` (a JSON answer's schema), ``max_tokens``,
            ``logit_bias``, ``top_k``, ``template_kwargs.<name>``, or ``None``.
    """

    def __init__(self, message: str, code: str | None = None,
                 field: str | None = "messages") -> None:
        super().__init__(message)
        self.code, self.field = code, field


class ModelUnavailable(EngineError):
    """The request names a model that is not the loaded one (HTTP 404 ``model_not_found``)."""


class ModelLoadError(EngineError):
    """The model failed to load or reload, so nothing can be served until a swap to a
    model that loads (HTTP 503)."""


class EngineUnavailable(EngineError):
    """The engine process is gone, starting again, shutting down or not answering
    (HTTP 503): the request may succeed if retried."""
