""":class:`EngineConfig`: every engine and server setting, validated once.

Built from :data:`kit.knobs.KNOBS` (the one declaration of each knob: flag, variable,
default, unit, bounds, help) as a frozen pydantic-settings model: values come from the
command line, else the ``MLX_KIT_*`` environment, else the default. The CLI builds it with
:meth:`EngineConfig.from_flags`; ``launch`` hands a server it starts
:meth:`EngineConfig.to_argv`; the engine process gets :meth:`EngineConfig.for_engine`
(whole, as the ``init`` record on its anonymous pipe, or signed inside the ranks' setup
record; never pickled).

This module imports pydantic: the CLI imports it only once a command runs.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationError, \
    model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict, \
    SettingsError

from kit.errors import ConfigError
from kit.knobs import KNOBS, Knob, env, environment
from kit.models.memory import parse_size
from kit.engine.cache.kv import check_kv, resolve_max_batch


def _size(value: Any) -> Any:
    """``8GiB`` / ``8GB`` / ``123`` -> bytes (ConfigError's text becomes the field's error)."""
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ConfigError as e:
            raise ValueError(e.message) from None
    return value


def _comma_list(value: Any) -> Any:
    """A variable's ``a,b`` -> ``("a", "b")`` (blank items dropped); a flag's list as given."""
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return value


def _absolute(value: Any) -> Any:
    """A path made absolute as spelt (``~`` expanded, links not resolved: ``serve`` checks
    what the path names itself)."""
    if isinstance(value, (str, Path)) and str(value):
        return str(Path(value).expanduser().absolute())
    return value


def _annotation(k: Knob) -> Any:
    """The pydantic type of a knob's field."""
    if k.kind == "size":
        base: Any = Annotated[int, BeforeValidator(_size)]
    elif k.kind == "list":
        base = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)]
    elif k.kind == "secret":
        base = SecretStr
    elif k.path:
        base = Annotated[str, BeforeValidator(_absolute)]
    else:
        base = k.kind
    return Optional[base] if k.default is None else base


def _field(k: Knob) -> Any:
    extra = {"flag": k.flag, "env": k.env_var, "unit": k.unit, "hidden": k.hidden,
             "secret": k.secret, "commands": list(k.commands)}
    # the variable's name only (AliasChoices): a field name such as "port" must never be
    # read from a bare PORT variable; init keywords use the name (populate_by_name)
    return Field(k.default, description=k.help, ge=k.ge, le=k.le,
                 validation_alias=AliasChoices(k.env_var), json_schema_extra=extra)


class _KnobVariables(EnvSettingsSource):
    """pydantic-settings' environment source over :func:`kit.knobs.environment` (the one
    module that reads ``MLX_KIT_*``), not the whole of ``os.environ``."""

    def _load_env_vars(self) -> dict[str, str | None]:
        return dict(environment())


class _Config(BaseSettings):
    """The methods of :class:`EngineConfig` (its fields come from :data:`KNOBS`)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", populate_by_name=True,
                                      case_sensitive=True, env_prefix="")

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, **_: Any
                                   ) -> tuple[Any, ...]:
        # keywords (the command line), then the knobs' variables; no .env or secrets dir
        return init_settings, _KnobVariables(settings_cls, case_sensitive=True)

    @model_validator(mode="after")
    def _checks(self) -> "_Config":
        # the one place KV settings are checked: every command and engine gets a config

        check_kv(self.kv_bits, self.kv_group_size)
        resolve_max_batch(self.max_batch, self.kv_bits)  # ConfigError naming both flags
        if self.adapter and (self.ranks or self.hosts or self.hostfile):
            raise ConfigError("--adapter runs on one machine; it cannot be used with "
                              "--ranks, --hosts or --hostfile")
        if self.draft_model and (self.ranks or self.hosts or self.hostfile):
            raise ConfigError("--draft-model runs on one machine; it cannot be used with "
                              "--ranks, --hosts or --hostfile")
        return self

    @classmethod
    def from_flags(cls, given: dict[str, Any]) -> "EngineConfig":
        """The config of the flags ``given`` (field name -> value, only those on the command
        line), the ``MLX_KIT_*`` environment for the rest, defaults for what neither sets.

        Raises:
            ConfigError: a value is refused; the message names the flag, or the variable
                when the value came from the environment.
        """
        given = dict(given)
        for k in KNOBS:  # a list knob's flags add to its variable's items (as they always did)
            if k.kind == "list" and k.name in given and env(k.env_var):
                given[k.name] = tuple(dict.fromkeys([*_comma_list(env(k.env_var)),
                                                     *given[k.name]]))
        try:
            return cls(**given)  # type: ignore[return-value]
        except ValidationError as e:
            raise _config_error(e, given) from None
        except SettingsError as e:
            raise ConfigError(str(e), hint="see `mlx-kit serve --help`") from None

    @property
    def batch(self) -> int:
        """The ``max_batch`` the engine runs with (8, or 1 with ``kv_bits``)."""
        return resolve_max_batch(self.max_batch, self.kv_bits)

    @property
    def distributed(self) -> bool:
        """Whether a flag asks for a world of ranks."""
        return bool(self.ranks or self.hosts or self.hostfile)

    def secret(self, name: str) -> str | None:
        """A secret field's plain value (None: unset)."""
        value = getattr(self, name)
        return value.get_secret_value() if value is not None else None

    def for_engine(self, **update: Any) -> "EngineConfig":
        """This config without its secrets (the engine needs no API key, and a rank's copy
        travels to other machines), with ``update`` applied (a distributed engine turns the
        disk tier off)."""
        blank = {k.name: None for k in KNOBS if k.secret}
        return self.model_copy(update={**blank, **update})  # type: ignore[return-value]

    def to_argv(self, command: str = "serve", exclude: frozenset[str] = frozenset()
                ) -> list[str]:
        """``command``'s flags that give this config's values where they differ from the
        defaults (what ``launch`` passes to ``serve``); secrets never (they go through the
        environment or a 0600 file), nor the names in ``exclude``. Parsing the result with
        ``command`` gives an equal config (sizes are spelt in bytes).
        """
        argv: list[str] = []
        for k in KNOBS:
            value = getattr(self, k.name)
            if command not in k.commands or k.secret or k.name in exclude \
                    or value == k.default:
                continue
            if isinstance(value, Enum):
                value = value.value
            if k.kind is bool:
                argv.append(k.flag if value else f"--no-{k.flag[2:]}")
            elif k.kind == "list":
                for item in value:
                    argv += [k.flag, item]
            else:
                argv += [k.flag, str(value)]
        return argv


def _config_error(e: ValidationError, given: dict[str, Any]) -> ConfigError:
    """The first refused value, named as the user gave it (a flag or a variable)."""
    err = e.errors()[0]
    loc = str(err["loc"][0]) if err.get("loc") else ""
    k = next((k for k in KNOBS if loc in (k.name, k.env_var)), None)
    if k is None:  # a check of several fields (the KV settings): its own message
        return ConfigError(str(err.get("msg", e)).removeprefix("Value error, "))
    where = k.flag if k.name in given else k.env_var
    value = given.get(k.name, err.get("input"))
    if k.secret:
        value = "***"
    reason = str(err.get("msg", "")).removeprefix("Value error, ")
    shown = f"{where}: " if repr(value) in reason else f"{where} {value}: "
    return ConfigError(shown + reason,
                       hint=f"see --help for {k.flag}")


EngineConfig = type("EngineConfig", (_Config,), {
    "__module__": __name__, "__qualname__": "EngineConfig",
    "__doc__": """Every engine and server setting (:data:`kit.knobs.KNOBS`), frozen.

    Sizes are bytes, times seconds; list knobs are tuples of str; secrets are
    ``SecretStr``. Build it with :meth:`from_flags` (or ``EngineConfig(port=...)``, which
    reads the environment for the rest).

    Raises (on construction):
        pydantic.ValidationError: a value out of its bounds or of the wrong type;
            ConfigError's text for KV settings mlx-kit does not offer.
    """,
    "__annotations__": {k.name: _annotation(k) for k in KNOBS},
    **{k.name: _field(k) for k in KNOBS},
})
