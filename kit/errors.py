"""The one error tree of mlx-kit.

    KitError                      expected failure: one line for the user + an optional hint
    ├── ConfigError               bad user input (flags, URLs, config files)
    ├── ModelError                a model cannot be found, converted or loaded
    │   └── ModelNotFoundError    an id that names no model we can serve
    ├── ServerError               the server cannot be reached, started or stopped
    │   └── PortInUseError        something that is not mlx-kit holds the port
    ├── HarnessError              an agent cannot be configured or removed
    └── AgentNotInstalledError    the agent's binary is not on PATH

The CLI prints a KitError as ``error: <message>`` (+ ``hint: <hint>``) and exits 1; any other
exception is unexpected and is reported with the path of a log file.
"""

from __future__ import annotations


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


def reduce_error(error: BaseException) -> tuple:
    """``__reduce__`` for exceptions whose ``__init__`` does not take ``self.args`` back
    (keyword fields, formatted messages): rebuilt from args and attributes, so they cross
    from the engine process to the server unchanged."""
    return _rebuild, (type(error), error.args, dict(error.__dict__))


class KitError(Exception):
    """An expected failure with a message meant for the user.

    Args:
        message: one line saying what went wrong.
        hint: optional one line saying how to fix it.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    __reduce__ = reduce_error


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


class ServerError(KitError):
    """The server cannot be reached, started or stopped."""


class PortInUseError(ServerError):
    """Something that is not an mlx-kit server answers on the configured address."""


class HarnessError(KitError):
    """An agent cannot be configured or its configuration removed."""


class AgentNotInstalledError(KitError):
    """The agent's binary is not on PATH; ``hint`` holds the exact install command."""
