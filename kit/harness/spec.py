"""Declarative agent specs (``harnesses/<agent>.toml``) loaded into frozen objects.

Schema (unknown keys are an error, so a typo never passes silently)::

    name = "pi"                       # the agent's id on the command line
    description = "..."
    binary = "pi"                     # executable looked up on PATH
    install = "npm install -g ..."    # the exact command that installs the agent
    api = "openai-completions"        # the wire API the agent speaks to our server
    verified = ["0.73.1", "1.6.0"]    # oldest and newest agent version the template was
                                      #   tested with (optional; `harness status` flags
                                      #   an installed version newer than the last)
    [config_dir]                      # the agent's config folder
    env = "PI_CODING_AGENT_DIR"       #   an env var that moves it (optional), or a list
                                      #   of "VAR" / "VAR/sub/dir", the first set one wins
                                      #   (["GOOSE_PATH_ROOT/config", "XDG_CONFIG_HOME/goose"])
    darwin_env = []                   #   the list used on macOS instead (optional)
    default = "~/.pi/agent"           #   else this
    darwin = "~/Library/..."          #   else this on macOS (optional)
    [[files]]                         # one per generated file
    path = "extensions/mlx-kit.ts"    #   relative to config_dir
    template = "pi/mlx-kit.ts.j2"     #   relative to templates/
    mode = "drop-in"                  #   a whole file we own, or "merge": our entries go
    format = "yaml"                   #     into the user's file (yaml | toml | json),
    strategy = "list-by-key"          #     as list entries identified by `key`, or
    key = "model_id"                  #     ("keys") at the dotted paths in `owns`;
    owns = ["provider.mlx-kit"]       #     "a.b[id]" owns our entries of the list at a.b,
                                      #     by their id (see kit/harness/merge.py)
    [launch]
    args = ["--provider", "mlx-kit", "--model", "local"]   # argv after the binary
    env = {}                          # extra environment for the agent's process
    env_defaults = {}                 # environment set only where the user has not set it
                                      # Values may name {file0} (our first file's path),
                                      # {config_dir}, {root_url} (the server's root URL,
                                      # no /v1), {api_key} ($MLX_KIT_API_KEY, else
                                      # a placeholder), and {context_window}/{max_tokens}
                                      # of the model behind `local` (as the server reports)
"""

from __future__ import annotations

import os
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import HarnessError
from kit.harness.formats import FORMATS
from kit.harness.merge import MergeSpec, list_selector
from kit.paths import harnesses_dir, templates_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODES = ("drop-in", "merge")
STRATEGIES = ("list-by-key", "keys")
_TOP_KEYS = {"name", "description", "binary", "install", "api", "verified", "config_dir",
             "files", "launch"}


@dataclass(frozen=True)
class FileSpec:
    """One generated file: where it goes (relative to the config dir), from which template,
    and, for ``mode = "merge"``, how our fragment goes into the user's file."""

    path: str
    template: str
    mode: str = "drop-in"
    merge: MergeSpec | None = None


@dataclass(frozen=True)
class HarnessSpec:
    """An agent, as data. See the module docstring for the schema."""

    name: str
    description: str
    binary: str
    install: str
    api: str
    config_dir_env: tuple[str, ...]
    config_dir_default: str
    config_dir_darwin: str | None
    files: tuple[FileSpec, ...]
    launch_args: tuple[str, ...]
    launch_env: tuple[tuple[str, str], ...]
    config_dir_darwin_env: tuple[str, ...] | None = None
    launch_env_defaults: tuple[tuple[str, str], ...] = ()
    verified: tuple[str, str] | None = None

    def config_dir(self, environ: dict[str, str] | None = None) -> Path:
        """The agent's config folder: the first of its env vars that is set (with its sub
        folder, for ``"VAR/sub/dir"``), else the default (``~`` expanded)."""
        env = os.environ if environ is None else environ
        darwin = sys.platform == "darwin"
        default = self.config_dir_darwin if darwin and self.config_dir_darwin \
            else self.config_dir_default
        candidates = self.config_dir_darwin_env if darwin and \
            self.config_dir_darwin_env is not None else self.config_dir_env
        for candidate in candidates:
            var, _, sub = candidate.partition("/")
            if env.get(var):
                return Path(os.path.expanduser(env[var])) / sub
        return Path(os.path.expanduser(default))

    def file_paths(self) -> list[tuple[FileSpec, Path]]:
        """Each generated file with its absolute target path."""
        base = self.config_dir()
        return [(f, base / f.path) for f in self.files]

    @property
    def uses_model_limits(self) -> bool:
        """Whether a launch value names ``{context_window}`` or ``{max_tokens}``."""
        values = [*self.launch_args, *(v for _, v in self.launch_env),
                  *(v for _, v in self.launch_env_defaults)]
        return any("{" + name + "}" in v for v in values for name in _MODEL_VALUES)

    def launch_command(self, binary: str, extra: list[str],
                       local: dict[str, Any] | None = None,
                       environ: dict[str, str] | None = None,
                       root_url: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The agent's argv and the extra environment for its process.

        Values may name ``{file0}``, ``{file1}``... (our files' paths), ``{config_dir}``,
        ``{root_url}`` (the server's root URL, for agents that take it only from the
        environment, e.g. Gemini CLI's GOOGLE_GEMINI_BASE_URL), ``{api_key}``
        (``$MLX_KIT_API_KEY`` of ``environ``, else ``mlx-kit``: agents that refuse to run
        without a key get one a keyless server ignores), and ``{context_window}`` /
        ``{max_tokens}`` of ``local`` (the /v1/models entry of
        the model behind ``local``). ``env_defaults`` are left out where ``environ`` (the
        process environment by default) already sets them.

        Raises:
            HarnessError: a value names the model's limits and ``local`` lacks them.
        """
        env = os.environ if environ is None else environ
        values = {f"file{i}": str(p) for i, (_, p) in enumerate(self.file_paths())}
        values["config_dir"] = str(self.config_dir())
        values["api_key"] = env.get(API_KEY_ENV) or "mlx-kit"
        if root_url is not None:
            values["root_url"] = root_url
        for limit in _MODEL_VALUES:
            if isinstance((local or {}).get(limit), int):
                values[limit] = str(local[limit])

        def fill(text: str) -> str:
            try:
                return text.format(**values)
            except KeyError as e:
                raise HarnessError(f"{self.name}: launch needs the {e.args[0]} of the model "
                                   "behind local, and the server did not report it") from None

        argv = [binary, *(fill(a) for a in self.launch_args), *extra]
        extra_env = {k: fill(v) for k, v in self.launch_env}
        extra_env.update({k: fill(v) for k, v in self.launch_env_defaults if k not in env})
        return argv, extra_env


#: What launch values may name besides ``{fileN}`` and ``{config_dir}``.
_MODEL_VALUES = ("context_window", "max_tokens")
API_KEY_ENV = "MLX_KIT_API_KEY"  # the server's --api-key variable; render.py names it too


def _check_placeholders(values: list[str], files: int, where: str) -> None:
    """Refuse a launch value that names anything but our files, the config dir and the
    model's limits (a typo would otherwise only fail when the agent is launched)."""
    known = {f"file{i}" for i in range(files)} | {"config_dir", "root_url", "api_key",
                                                  *_MODEL_VALUES}
    for value in values:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as e:
            raise HarnessError(f"{where}: bad launch value {value!r}: {e}") from None
        for name in names:
            if name not in known:
                raise HarnessError(f"{where}: launch value {value!r} names {{{name}}}",
                                   hint="known: " + ", ".join(sorted(known)))


def _env_list(value: Any, where: str) -> tuple[str, ...]:
    """A config_dir env setting: one variable name or a list of "VAR[/sub/dir]"."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v and not v.startswith("/")
                                              for v in items):
        raise HarnessError(f"{where}: env must be a variable name or a list of "
                           "\"VAR\" / \"VAR/sub/dir\"")
    return tuple(items)


def _require(data: dict, key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise HarnessError(f"{where}: '{key}' must be a {kind.__name__}")
    return value


def _parse(data: dict[str, Any], where: str) -> HarnessSpec:
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise HarnessError(f"{where}: unknown keys {sorted(unknown)}")
    cfg = _require(data, "config_dir", dict, where)
    files = []
    for i, f in enumerate(_require(data, "files", list, where)):
        fw = f"{where}: files[{i}]"
        if not isinstance(f, dict) or set(f) - {"path", "template", "mode", "format",
                                                "strategy", "key", "owns"}:
            raise HarnessError(f"{fw}: expected a table with path, template, mode "
                               "(+ format, strategy, key, owns for merge)")
        mode = f.get("mode", "drop-in")
        if mode not in MODES:
            raise HarnessError(f"{fw}: mode must be one of {MODES}")
        template = _require(f, "template", str, fw)
        if not (templates_dir() / template).is_file():
            raise HarnessError(f"{fw}: template {template!r} not found")
        merge = None
        if mode == "merge":
            if f.get("format") not in FORMATS or f.get("strategy") not in STRATEGIES:
                raise HarnessError(f"{fw}: merge needs format in {FORMATS} and strategy in "
                                   f"{STRATEGIES}")
            if f["strategy"] == "list-by-key" and not isinstance(f.get("key"), str):
                raise HarnessError(f"{fw}: strategy list-by-key needs key")
            if f["strategy"] == "keys" and not f.get("owns"):
                raise HarnessError(f"{fw}: strategy keys needs owns (dotted key paths)")
            owns = f.get("owns", [])
            if not isinstance(owns, list) or not all(isinstance(o, str) and o for o in owns):
                raise HarnessError(f"{fw}: owns must be a list of dotted key paths")
            for owned in owns:
                try:
                    list_selector(owned)
                except HarnessError as e:
                    raise HarnessError(f"{fw}: {e.message}") from None
            merge = MergeSpec(f["format"], f["strategy"], f.get("key"), tuple(f.get("owns", ())))
        files.append(FileSpec(_require(f, "path", str, fw), template, mode, merge))
    launch = data.get("launch", {})
    if not isinstance(launch, dict) or set(launch) - {"args", "env", "env_defaults"}:
        raise HarnessError(f"{where}: [launch] takes args, env and env_defaults")
    for table in ("env", "env_defaults"):
        if not isinstance(launch.get(table, {}), dict) or not all(
                isinstance(v, str) for v in launch.get(table, {}).values()):
            raise HarnessError(f"{where}: launch.{table} must map variable names to strings")
    if not isinstance(launch.get("args", []), list) or not all(
            isinstance(a, str) for a in launch.get("args", [])):
        raise HarnessError(f"{where}: launch.args must be a list of strings")
    _check_placeholders([*launch.get("args", ()), *launch.get("env", {}).values(),
                         *launch.get("env_defaults", {}).values()], len(files), where)
    verified = data.get("verified")
    if verified is not None and not (isinstance(verified, list) and len(verified) == 2 and all(
            isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)*", v) for v in verified)):
        raise HarnessError(f"{where}: verified must be [oldest, newest] versions, "
                           "e.g. [\"0.73.1\", \"1.6.0\"]")
    unknown_cfg = set(cfg) - {"env", "darwin_env", "default", "darwin"}
    if unknown_cfg:
        raise HarnessError(f"{where}: config_dir: unknown keys {sorted(unknown_cfg)}")
    return HarnessSpec(
        name=_require(data, "name", str, where),
        description=data.get("description", ""),
        binary=_require(data, "binary", str, where),
        install=_require(data, "install", str, where),
        api=_require(data, "api", str, where),
        config_dir_env=_env_list(cfg["env"], f"{where}: config_dir") if "env" in cfg else (),
        config_dir_default=_require(cfg, "default", str, f"{where}: config_dir"),
        config_dir_darwin=cfg.get("darwin"),
        files=tuple(files),
        launch_args=tuple(launch.get("args", ())),
        launch_env=tuple(sorted(launch.get("env", {}).items())),
        config_dir_darwin_env=_env_list(cfg["darwin_env"], f"{where}: config_dir")
        if "darwin_env" in cfg else None,
        launch_env_defaults=tuple(sorted(launch.get("env_defaults", {}).items())),
        verified=tuple(verified) if verified else None,
    )


def all_specs() -> dict[str, HarnessSpec]:
    """Every agent spec shipped in ``harnesses/``, by name.

    Raises:
        HarnessError: a spec file is malformed.
    """
    specs = {}
    for path in sorted(harnesses_dir().glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise HarnessError(f"{path.name}: not valid TOML: {e}") from None
        spec = _parse(data, path.name)
        specs[spec.name] = spec
    return specs


def load_spec(name: str) -> HarnessSpec:
    """The spec of one agent.

    Raises:
        HarnessError: no such agent (the message lists the known ones).
    """
    specs = all_specs()
    if name not in specs:
        raise HarnessError(f"unknown agent {name!r}", hint="known agents: " + ", ".join(specs))
    return specs[name]
