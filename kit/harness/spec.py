"""Agent specs (``harnesses/<agent>.toml``) as validated data: pydantic models, frozen.

Every table refuses unknown keys, so a typo never passes silently; enumerations are
Literals; the cross-field rules (launch placeholders, merge rules) are validators. A
problem is one line naming the file and the dotted key (:mod:`kit.harness.spec_errors`).
The fields' descriptions are the reference: they are published as the JSON schema
docs/agents/harness-spec.schema.json (``python -m kit.harness.schema``), which editors use
to complete and check spec files; docs/agents/adding-an-agent.md is the walk-through.

:func:`parse_spec` validates one spec's parsed TOML; :mod:`kit.harness.spec_loader` finds
and reads the spec files of every search root (``load_all``, ``load_spec``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictStr, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from kit.errors import HarnessError
from kit.harness.formats import FORMATS
from kit.harness.merge import MergeSpec
from kit.harness.spec_errors import SpecValueError, spec_error
from kit.harness.spec_types import (EnvList, EnvName, Folder, LaunchValue, Owned, RelPath, Text,
                                    VarName, VarValue, Version, placeholders)
from kit.paths import config_dir, templates_dir

#: The wire APIs our server speaks, as ``api`` names them, and the route each is served
#: at. The names are the ones pi and its SDK use ("openai-completions" is Chat Completions).
APIS = {"openai-completions": "/v1/chat/completions", "openai-responses": "/v1/responses",
        "anthropic-messages": "/v1/messages", "gemini": "/v1beta/models"}
MODES = ("drop-in", "merge")
STRATEGIES = ("list-by-key", "keys")
API_KEY_ENV = "MLX_KIT_API_KEY"  # the server's --api-key variable; render.py names it too
#: What launch values may name besides ``{fileN}`` and ``{config_dir}``.
_MODEL_VALUES = ("context_window", "max_tokens")
_LAUNCH_VALUES = ("config_dir", "root_url", "api_key", *_MODEL_VALUES)


class _Table(BaseModel):
    """A TOML table: unknown keys refused (a typo must not pass silently), frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigDirSpec(_Table):
    """[config_dir]: the agent's config folder, where its files go."""

    env: EnvList = Field(default=(), description=(
        "An environment variable that moves the folder, or a list of \"VAR\" / "
        "\"VAR/sub/dir\": the first one set wins (e.g. [\"GOOSE_PATH_ROOT/config\", "
        "\"XDG_CONFIG_HOME/goose\"])."))
    darwin_env: Optional[EnvList] = Field(default=None, description=(
        "The list used on macOS instead of env ([] for none)."))
    default: Folder = Field(description=(
        "The folder when no env variable is set: starts with ~, / or {kit_config_dir} "
        "(mlx-kit's own config folder, from platformdirs)."))
    darwin: Optional[Folder] = Field(default=None, description=(
        "The folder on macOS instead of default."))


class FileSpec(_Table):
    """[[files]]: one file mlx-kit writes, from one template."""

    path: RelPath = Field(description="Where the file goes, relative to the config folder.")
    template: RelPath = Field(description=(
        "Its Jinja template, relative to the templates folder beside the spec's "
        "harnesses folder (\"<agent>/<file>.j2\")."))
    mode: Literal[MODES] = Field(default="drop-in", description=(
        "drop-in: a whole file mlx-kit owns (its first lines carry the marker); merge: our "
        "entries go into the user's own file, every other byte stays."))
    format: Optional[Literal[FORMATS]] = Field(default=None, description=(
        "merge only: the file's format."))
    strategy: Optional[Literal[STRATEGIES]] = Field(default=None, description=(
        "merge only: list-by-key (the file is a list; ours are the entries whose `key` "
        "matches) or keys (the file is a mapping; ours are the dotted paths in `owns`)."))
    key: Optional[Text] = Field(default=None, description=(
        "list-by-key only: the field that identifies an entry (e.g. model_id)."))
    owns: tuple[Owned, ...] = Field(default=(), max_length=32, description=(
        "keys only: the dotted key paths we own, e.g. \"provider.mlx-kit\"; "
        "\"a.b[id]\" owns our entries of the list at a.b, by their id."))
    stamped: tuple[Owned, ...] = Field(default=(), max_length=32, description=(
        "keys only: dotted paths inside an owned key that the agent itself rewrites on "
        "every run (a timestamp, e.g. \"providers.x.updatedAt\"): a changed value there "
        "is not an edit of ours, so removal still takes our entry out."))

    @field_validator("template")
    @classmethod
    def _template_exists(cls, value: str, info: ValidationInfo) -> str:
        root = (info.context or {}).get("templates")
        if root is not None and not (Path(root) / value).is_file():
            raise SpecValueError(f"template {value!r} not found", hint=f"looked in {root}")
        return value

    @model_validator(mode="after")
    def _merge_rules(self) -> FileSpec:
        if self.mode == "drop-in":
            if self.format or self.strategy or self.key or self.owns or self.stamped:
                raise ValueError('format, strategy, key, owns and stamped are for '
                                 'mode = "merge"')
            return self
        if self.format is None or self.strategy is None:
            raise ValueError(f"merge needs format in {FORMATS} and strategy in {STRATEGIES}")
        if self.strategy == "list-by-key" and (self.key is None or self.owns):
            raise ValueError("strategy list-by-key needs key (and takes no owns)")
        if self.strategy == "keys" and (not self.owns or self.key is not None):
            raise ValueError("strategy keys needs owns (dotted key paths) and takes no key")
        for path in self.stamped:
            if "[" in path or not any(path.startswith(o + ".") for o in self.owns):
                raise ValueError(f"stamped {path!r} is not a plain dotted path inside one "
                                 "of owns")
        return self

    @property
    def merge(self) -> MergeSpec | None:
        """How our fragment goes into the user's file (None for a drop-in)."""
        if self.mode != "merge":
            return None
        return MergeSpec(self.format, self.strategy, self.key, tuple(self.owns),
                         tuple(self.stamped))


class LaunchSpec(_Table):
    """[launch]: how `mlx-kit launch` runs the agent. Values may name {file0},
    {file1}... (our files' paths), {config_dir}, {root_url} (the server's root URL, no
    /v1), {api_key} ($MLX_KIT_API_KEY, else a placeholder; in env only, never args),
    {context_window} and {max_tokens} (of the model behind `local`, as the server reports
    them)."""

    args: tuple[LaunchValue, ...] = Field(default=(), max_length=64, description=(
        "The argv after the binary (the user's own arguments after -- follow)."))
    env: dict[EnvName, LaunchValue] = Field(default_factory=dict, max_length=64, description=(
        "Extra environment for the agent's process."))
    env_defaults: dict[EnvName, LaunchValue] = Field(
        default_factory=dict, max_length=64, description=(
            "Environment set only where the user has not set it."))


#: How a package agent's install line reads, for users who install it themselves.
_INSTALL_LINES = {"npm": "npm install -g {name}@{version}", "pypi": "pipx install {name}=={version}"}


class PackageSpec(_Table):
    """[package]: the agent's package in a registry, from which mlx-kit installs it into its
    own tools folder (`mlx-kit harness install-agent`, `launch --install`) at the newest
    `verified` version, and from which the `install` line people read is derived."""

    registry: Literal["npm", "pypi"] = Field(description=(
        "npm (installed with npm into <tools>/<agent>/<version>/node_modules) or pypi "
        "(a venv of its own, <tools>/<agent>/<version>/venv)."))
    name: Annotated[StrictStr, Field(
        pattern=r"^(@[a-z0-9][a-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=214)] = \
        Field(description="The package's name in that registry, e.g. "
                          "\"@earendil-works/pi-coding-agent\" or \"aider-chat\".")
    node: Optional[Version] = Field(default=None, description=(
        "npm only: the oldest Node the package runs on (its engines.node), e.g. \"22.19\"; "
        "an older or missing system node makes mlx-kit use its own pinned Node."))
    postinstall: Optional[RelPath] = Field(default=None, description=(
        "npm only: the package's install script, relative to its folder, that must run "
        "for the agent to work (npm runs with --ignore-scripts; mlx-kit then runs this one "
        "with node and a throwaway HOME), e.g. \"postinstall.mjs\"."))

    @model_validator(mode="after")
    def _npm_only(self) -> PackageSpec:
        if self.registry != "npm" and (self.node or self.postinstall):
            raise ValueError("node and postinstall are for registry = \"npm\"")
        return self


class HarnessSpec(_Table):
    """An agent, as data: one harnesses/<agent>.toml."""

    name: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=40)] = Field(
        description="The agent's id on the command line (lowercase letters, digits, - and _).")
    description: Annotated[StrictStr, Field(max_length=200)] = Field(
        default="", description="One line for `harness list`.")
    binary: Text = Field(description="The executable, looked up on PATH.")
    install_line: Optional[Text] = Field(default=None, alias="install", description=(
        "For an agent with no [package]: the official command that installs it, printed "
        "when it is missing. Left out with [package] (derived from it)."))
    package: Optional[PackageSpec] = Field(default=None, description=(
        "The agent's registry package: mlx-kit installs it on demand at the newest "
        "verified version (needs verified)."))
    api: Literal[tuple(APIS)] = Field(description=(
        "The wire API the agent speaks to our server: openai-completions (Chat "
        "Completions, /v1/chat/completions), openai-responses (/v1/responses), "
        "anthropic-messages (/v1/messages) or gemini (/v1beta)."))
    verified: Optional[Annotated[tuple[Version, ...], Field(min_length=2, max_length=2)]] = \
        Field(default=None, description=(
            "The oldest and newest agent version the templates were tested with, "
            "[\"0.73.1\", \"1.6.0\"]: `harness status` flags an installed version newer "
            "than the newest."))
    config_dir_table: ConfigDirSpec = Field(alias="config_dir", description=(
        "The agent's config folder."))
    files: tuple[FileSpec, ...] = Field(max_length=16, description="The files mlx-kit writes.")
    launch: LaunchSpec = Field(default_factory=LaunchSpec, description=(
        "How `mlx-kit launch` runs the agent."))
    vars: dict[VarName, VarValue] = Field(default_factory=dict, max_length=64, description=(
        "This agent's own template variables (strings, integers, numbers, booleans): its "
        "templates read them as {{ vars.<name> }}; no other agent sees them."))

    @model_validator(mode="after")
    def _one_install(self) -> HarnessSpec:
        if self.package is None and self.install_line is None:
            raise SpecValueError("an agent needs [package] (a registry package) or install "
                                 "(the official install command)", key=("package",))
        if self.package is not None and self.install_line is not None:
            raise SpecValueError("install is derived from [package]; leave it out",
                                 key=("install",))
        if self.package is not None and self.verified is None:
            raise SpecValueError("[package] installs the newest verified version: add "
                                 "verified = [oldest, newest]", key=("package",))
        return self

    @property
    def install(self) -> str:
        """The command that installs the agent by hand: the spec's own, or the one its
        package implies (``npm install -g NAME@NEWEST`` / ``pipx install NAME==NEWEST``)."""
        if self.package is None:
            assert self.install_line is not None  # _one_install
            return self.install_line
        assert self.verified is not None
        return _INSTALL_LINES[self.package.registry].format(name=self.package.name,
                                                            version=self.verified[1])

    @property
    def install_hint(self) -> str:
        """How a user installs the missing agent: mlx-kit's own command for a registry
        package (into its tools folder, no global install), then the manual one."""
        if self.package is None:
            return self.install
        return f"mlx-kit harness install-agent {self.name}, or: {self.install}"

    _source: Optional[Path] = PrivateAttr(default=None)
    _templates: Optional[Path] = PrivateAttr(default=None)
    _builtin: bool = PrivateAttr(default=True)

    @model_validator(mode="after")
    def _known_placeholders(self) -> HarnessSpec:
        """Refuse a launch value that names anything but our files, the config dir, the
        URL, the key and the model's limits (a typo would otherwise only fail when the
        agent is launched)."""
        known = sorted({f"file{i}" for i in range(len(self.files))} | set(_LAUNCH_VALUES))
        values = [(("launch", "args", i), v) for i, v in enumerate(self.launch.args)]
        for table in ("env", "env_defaults"):
            values += [(("launch", table, k), v)
                       for k, v in getattr(self.launch, table).items()]
        for key, value in values:
            try:
                names = placeholders(value)
            except ValueError as e:
                raise SpecValueError(str(e), key=key) from None
            for name in names:
                if name not in known:
                    raise SpecValueError(f"launch value {value!r} names {{{name}}}", key=key,
                                         hint="known: " + ", ".join(known))
                if name == "api_key" and key[1] == "args":
                    # an agent's argv is readable by every local user (/proc/PID/cmdline)
                    raise SpecValueError("launch.args may not name {api_key}: other local "
                                         "users can read a command line", key=key,
                                         hint="pass it in launch.env instead")
        return self

    # --- where it came from ---------------------------------------------------------------

    @property
    def source(self) -> Path | None:
        """The spec file it was read from (None when parsed from data)."""
        return self._source

    @property
    def templates(self) -> Path:
        """The folder its ``template`` paths are relative to."""
        return self._templates or templates_dir()

    @property
    def builtin(self) -> bool:
        """Whether it ships with mlx-kit (else the user's own)."""
        return self._builtin

    # --- the names the harness code reads -------------------------------------------------

    @property
    def config_dir_env(self) -> tuple[str, ...]:
        return self.config_dir_table.env

    @property
    def config_dir_darwin_env(self) -> tuple[str, ...] | None:
        return self.config_dir_table.darwin_env

    @property
    def config_dir_default(self) -> str:
        return self.config_dir_table.default

    @property
    def config_dir_darwin(self) -> str | None:
        return self.config_dir_table.darwin

    @property
    def launch_args(self) -> tuple[str, ...]:
        return self.launch.args

    @property
    def launch_env(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.launch.env.items()))

    @property
    def launch_env_defaults(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.launch.env_defaults.items()))

    def config_dir(self, environ: dict[str, str] | None = None) -> Path:
        """The agent's config folder: the first of its env vars that is set (with its sub
        folder, for ``"VAR/sub/dir"``), else the default (``~`` and ``{kit_config_dir}``
        expanded)."""
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
        return Path(os.path.expanduser(default.format(kit_config_dir=str(config_dir()))))

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


# --- from data ----------------------------------------------------------------------------

def parse_spec(data: dict[str, Any], where: str, templates: Path | None = None, *,
               source: Path | None = None, builtin: bool = True) -> HarnessSpec:
    """A spec from its parsed TOML ``data``.

    Args:
        where: the file, as error messages name it.
        templates: the folder its templates are relative to (the bundled one by default);
            each must exist there.

    Raises:
        HarnessError: ``<where>: <dotted key>: <problem>`` (+ hint), for the first problem.
    """
    templates = templates_dir() if templates is None else templates
    try:
        spec = HarnessSpec.model_validate(data, context={"templates": templates})
    except ValidationError as e:
        raise spec_error(HarnessSpec, e, where) from None
    spec._source, spec._templates, spec._builtin = source, templates, builtin
    return spec
