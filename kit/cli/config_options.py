"""The typer options of the config knobs (:data:`kit.knobs.KNOBS`), built from the table.

:func:`takes_config` gives a command one ``typer.Option`` per knob it takes and hands it
one :class:`kit.config.EngineConfig`. It builds the command's ``__signature__`` with
``inspect`` because that is what typer reads options from: the other ways (a click
command subclass, a typer callback per knob) would each declare the options a second time
or leave typer's help and docs/cli.md generation. The options carry no ``envvar`` and pass
on only what the command line gave (click's parameter source): the environment is read
by pydantic-settings alone, so a bad variable is refused naming the variable, and flag >
environment > default holds for every knob the same way.
"""

from __future__ import annotations

import functools
import inspect
from enum import Enum
from typing import Any, Callable, List, Optional

import typer

from kit.knobs import Knob, knobs_of

_CTX = "_config_ctx"


def _option(k: Knob) -> tuple[Any, Any]:
    """``(annotation, typer.Option)`` of one knob."""
    names = [f"{k.flag}/--no-{k.flag[2:]}" if k.negatable else k.flag]
    if k.short:
        names.append(k.short)
    extra: dict[str, Any] = {}
    if k.kind in ("size", "secret"):
        kind: Any = str
    elif k.kind == "list":
        kind = List[str]
    else:
        kind = k.kind
    if isinstance(k.kind, type) and issubclass(k.kind, Enum):
        extra["case_sensitive"] = False
    if k.kind == "size":
        extra["metavar"] = "<size>"
    if kind in (int, float):  # the flag's bounds checked by click (exit 2, naming the flag)
        extra.update(min=k.ge, max=k.le)
    default = None if k.kind == "list" else k.default
    if k.kind == "size" and default is not None:
        default = k.shown_default or str(default)
    help_ = k.help if k.env_var in k.help else f"{k.help} [env {k.env_var}]"
    annotation = kind if (kind is bool and not k.negatable) or default is not None \
        else Optional[kind]
    return annotation, typer.Option(default, *names, help=help_, hidden=k.hidden, **extra)


def takes_config(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command ``fn(..., config)`` so that typer gives it every knob of
    ``command`` as an option and ``fn`` gets them as one ``config``
    (:meth:`kit.config.EngineConfig.from_flags`); ``fn`` may also take ``flags_given``
    (the knob names the command line gave, a frozenset).

    Raises (when the command runs):
        ConfigError: a flag's or variable's value is refused (naming it).
    """
    knobs = knobs_of(command)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(fn)
        wants_given = "flags_given" in own.parameters
        params = [p for p in own.parameters.values() if p.name not in ("config", "flags_given")]
        # resolved here, in fn's module: the wrapper's globals are this module's
        annotations = {p.name: eval(p.annotation, fn.__globals__)  # noqa: S307 (our source)
                       if isinstance(p.annotation, str) else p.annotation for p in params}
        params = [p.replace(annotation=annotations[p.name]) for p in params]
        for k in knobs:
            annotation, option = _option(k)
            params.append(inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY,
                                            default=option, annotation=annotation))
            annotations[k.name] = annotation
        # typer hands its context to one parameter only: the command's own, if it has one
        ctx_name = next((n for n, a in annotations.items() if a is typer.Context), None)
        if ctx_name is None:
            params.append(inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY,
                                            annotation=typer.Context))
            annotations[_CTX] = typer.Context

        @functools.wraps(fn)
        def command_fn(**kwargs: Any) -> Any:
            from kit.config import EngineConfig

            ctx = kwargs[ctx_name] if ctx_name else kwargs.pop(_CTX)
            given = {}
            for k in knobs:
                value = kwargs.pop(k.name)
                source = ctx.get_parameter_source(k.name)
                # by name: typer vendors click, whose ParameterSource is not click's
                if getattr(source, "name", None) == "COMMANDLINE":
                    given[k.name] = tuple(value) if k.kind == "list" else value
            config = EngineConfig.from_flags(given)
            if wants_given:
                kwargs["flags_given"] = frozenset(given)
            return fn(config=config, **kwargs)

        del command_fn.__wrapped__  # typer must read the new signature, not fn's
        command_fn.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        command_fn.__annotations__ = annotations
        return command_fn

    return decorate
