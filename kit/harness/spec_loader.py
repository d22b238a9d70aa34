"""Finding and reading agent specs: every search root of :func:`kit.paths.spec_roots`
through one function, :func:`load_all` — the bundled agents, then the user's own
(``<user config dir>/harnesses/*.toml``, templates in ``<user config dir>/templates/``).

A user's spec file is bounded before it is parsed (:data:`MAX_SPEC_BYTES`, TOML nesting)
and read only from its folder, or through a link out of it to a file the user chose
(:func:`kit.harness.files.read_inside`: stow's and home-manager's per-file links),
and a broken one is reported, never fatal to the other agents; validation itself is
:func:`kit.harness.spec.parse_spec`'s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kit.errors import HarnessError
from kit.harness.files import UNSAFE_HINT, UnsafeFile, read_inside
from kit.harness.spec import HarnessSpec, parse_spec
from kit.paths import SpecRoot, spec_roots

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_SPEC_BYTES = 256 * 1024  # a user's spec file larger than this is refused unread


def _read(path: Path, where: str, root: SpecRoot) -> HarnessSpec:
    try:
        raw = read_inside(root.harnesses, path, MAX_SPEC_BYTES)
        data = tomllib.loads(raw.decode("utf-8"))
    except UnsafeFile as e:
        raise HarnessError(f"{where}: {e}", hint=UNSAFE_HINT) from None
    except (OSError, UnicodeDecodeError) as e:
        raise HarnessError(f"{where}: cannot read it: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise HarnessError(f"{where}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise HarnessError(f"{where}: nested too deeply to be an agent spec",
                           hint="a spec's values are at most a few tables deep") from None
    return parse_spec(data, where, root.templates, source=path, builtin=root.builtin)


@dataclass(frozen=True)
class Agents:
    """Every agent found: ``specs`` by name (built-ins first, each root's files sorted),
    and ``problems``: the user's spec files that were refused, with why."""

    specs: dict[str, HarnessSpec]
    problems: dict[Path, HarnessError]


def load_all(roots: tuple[SpecRoot, ...] | None = None) -> Agents:
    """Load the specs of every root (:func:`kit.paths.spec_roots` by default), built-ins
    and the user's alike.

    A user spec that is broken, or names an agent already defined (a built-in, or an
    earlier user file), is left out and reported in ``problems``: the other agents still
    load. A name is never shadowed: install records, removal and `launch` all go by the
    agent's name, so one name must mean one spec (copy a built-in under a new name to
    change it).

    Raises:
        HarnessError: a built-in spec is broken (a packaging bug).
    """
    specs: dict[str, HarnessSpec] = {}
    problems: dict[Path, HarnessError] = {}
    for root in spec_roots() if roots is None else roots:
        try:
            paths = sorted(root.harnesses.glob("*.toml"))
        except OSError as e:  # pragma: no cover - an unreadable folder of the user's
            problems[root.harnesses] = HarnessError(f"{root.harnesses}: cannot list it: {e}")
            continue
        for path in paths:
            where = path.name if root.builtin else str(path)
            try:
                spec = _read(path, where, root)
                if spec.name in specs:
                    raise HarnessError(
                        f"{where}: agent {spec.name!r} is already defined by "
                        f"{specs[spec.name].source}",
                        hint="give yours another name (a user spec never replaces another)")
            except HarnessError as e:
                if root.builtin:
                    raise
                problems[path] = e
                continue
            specs[spec.name] = spec
    return Agents(specs, problems)


def all_specs() -> dict[str, HarnessSpec]:
    """Every agent that loads, by name: the bundled ones, then the user's (see
    :func:`load_all`; the user's broken spec files are left out).

    Raises:
        HarnessError: a bundled spec file is malformed.
    """
    return load_all().specs


def load_spec(name: str) -> HarnessSpec:
    """The spec of one agent.

    Raises:
        HarnessError: no such agent (the message lists the known ones), or the user's spec
            file ``<name>.toml`` was refused (its problem).
    """
    agents = load_all()
    if name in agents.specs:
        return agents.specs[name]
    for path, problem in agents.problems.items():
        if path.stem == name:
            raise problem
    hint = "known agents: " + ", ".join(sorted(agents.specs))
    if agents.problems:
        hint += f"; {len(agents.problems)} spec file(s) refused: see `mlx-kit harness list`"
    raise HarnessError(f"unknown agent {name!r}", hint=hint)
