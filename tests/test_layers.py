"""kit's import graph goes one way: an ast walk of every module's imports (those inside
functions and under ``if TYPE_CHECKING`` included) against the declared layer order.

- :data:`LAYERS` orders kit's packages and modules, lowest first: a module may import its
  own layer and those below it, never one above (an *upward* import).
- The graph of modules is a DAG: no cycle, even through an import inside a function.
- An import of kit's own module inside a function is allowed only where :data:`LAZY` says
  why: to keep mlx (or mlx-lm) out of a process that does not run a model (the target then
  imports mlx, checked), or to keep the CLI's start-up fast.

Failures name the importing file and line.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: kit's layers, lowest first. A module belongs to the longest entry it equals or sits under.
LAYERS: tuple[str, ...] = (
    "kit",  # the package itself: __version__
    "kit.knobs",  # every knob and MLX_KIT_* variable (stdlib only)
    "kit.errors",
    "kit.paths",
    "kit.owners",  # who besides this user may write a file or folder (stdlib only)
    "kit.urls",
    "kit.blas",
    "kit.mlx_lm_api",  # the one boundary to mlx-lm (imports none of it at import time)
    "kit.logpaths",  # which log files are ours, the --log-file checks
    "kit.logfile",
    "kit.logread",
    "kit.formats",
    "kit.models",
    "kit.engine.types",
    "kit.engine",  # the package's re-exports of kit.engine.types
    "kit.engine.status",  # EngineStatus: what the engine reports
    "kit.health",  # /health's body, built from EngineStatus; the CLI parses it
    "kit.probe",
    "kit.key_guard",  # whether the API key may go to what listens at a loopback URL
    "kit.engine.interface",
    "kit.engine.cache",
    "kit.config",  # EngineConfig (its KV checks are kit.engine.cache.kv's)
    "kit.engine.distributed.world_codec",  # the typed records both the ring and the pipe carry
    "kit.engine.decode",
    "kit.engine.proc",
    "kit.engine.distributed",
    "kit.embed",  # the embedding model's process and its pipe (beside the engine's)
    "kit.server",
    "kit.harness",
    "kit.daemon_stop",  # the pid file and stop (kit.daemon re-exports it)
    "kit.daemon",
    "kit.doctor",  # checks the machine, the server and the agents; kit.cli.doctor prints them
    "kit.cli",
    "kit.__main__",
)

MLX = "mlx"  # the target runs mlx or mlx-lm at import: kept out of processes without a model
STARTUP = "startup"  # a CLI command imports only what it runs (`mlx-kit --help` stays fast)


@dataclass(frozen=True)
class Lazy:
    """Imports of ``target`` (an fnmatch pattern of modules) inside functions of
    ``importer`` (likewise), and why they are there (:data:`MLX` or :data:`STARTUP`)."""

    importer: str
    target: str
    why: str
    note: str = ""


#: Every allowed import of kit's own modules inside a function, in one place.
LAZY: tuple[Lazy, ...] = (
    Lazy("kit.cli*", "kit*", STARTUP, "each command imports what it runs, when it runs"),
    Lazy("kit.probe", "kit.health", STARTUP,
         "pydantic only once a /health body is parsed (`mlx-kit status` imports the probe)"),
    Lazy("kit.engine.distributed.rank", "kit.engine.distributed.world", MLX,
         "a rank preloads its BLAS (kit.blas) before anything imports mlx"),
    Lazy("kit.engine.distributed.rank", "kit.engine.distributed.rank_inbox", MLX,
         "likewise: rank_inbox shares over the world"),
    Lazy("kit.engine.distributed.ring_guard", "kit.engine.distributed.world", MLX,
         "the server's process checks the ring's secret and sockets without mlx"),
)


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str
    where: str  # file:line
    in_function: bool


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "kit").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _known(name: str, mods: dict[str, Path]) -> str:
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def edges(mods: dict[str, Path]) -> tuple[list[Edge], dict[str, set[str]]]:
    """kit -> kit import edges, and each module's third-party imports at module level."""
    found: list[Edge] = []
    external: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        rel = path.relative_to(ROOT)

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.Lambda))
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join(up + ([child.module] if child.module else []))
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                             for a in child.names]
                for name in names:
                    if name == "kit" or name.startswith("kit."):
                        found.append(Edge(mod, _known(name, mods), f"{rel}:{child.lineno}",
                                          in_function))
                    elif not in_function:
                        external[mod].add(name.split(".")[0])
                visit(child, inner)

        visit(ast.parse(path.read_text()), False)
    return found, external


def layer(mod: str) -> int:
    best = max((p for p in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return LAYERS.index(best)


def _runs_mlx(mod: str, module_edges: dict[str, set[str]], external: dict[str, set[str]],
              seen: set[str] | None = None) -> bool:
    """Whether importing ``mod`` imports mlx or mlx_lm (through module-level imports)."""
    seen = set() if seen is None else seen
    if mod in seen:
        return False
    seen.add(mod)
    if external.get(mod, set()) & {"mlx", "mlx_lm"}:
        return True
    return any(_runs_mlx(t, module_edges, external, seen) for t in module_edges.get(mod, ()))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles Tarjan's strongly connected components find (one per component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _graph():
    mods = modules()
    found, external = edges(mods)
    found = [e for e in found if e.target != e.importer]
    return mods, found, external


def test_every_kit_module_has_a_layer():
    assert all(layer(m) >= 0 for m in modules())


def test_no_module_imports_a_layer_above_its_own():
    _, found, _ = _graph()
    upward = [f"{e.where}: {e.importer} ({LAYERS[layer(e.importer)]}) imports {e.target} "
              f"({LAYERS[layer(e.target)]}, a layer above)"
              for e in found if layer(e.target) > layer(e.importer)]
    assert not upward, f"{len(upward)} upward imports:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle():
    _, found, _ = _graph()
    graph: dict[str, set[str]] = {}
    for e in found:
        graph.setdefault(e.importer, set()).add(e.target)
    cycles = _cycles(graph)
    report = []
    for comp in cycles:
        members = set(comp)
        report.append(" <-> ".join(comp) + "\n" + "\n".join(
            f"    {e.where}: {e.importer} imports {e.target}" for e in found
            if e.importer in members and e.target in members))
    assert not cycles, f"{len(cycles)} import cycles:\n" + "\n".join(report)


def test_imports_inside_functions_are_the_listed_ones():
    _, found, external = _graph()
    module_edges: dict[str, set[str]] = {}
    for e in found:
        if not e.in_function:
            module_edges.setdefault(e.importer, set()).add(e.target)
    used: set[Lazy] = set()
    bad = []
    for e in (e for e in found if e.in_function):
        rule = next((r for r in LAZY if fnmatch.fnmatchcase(e.importer, r.importer)
                     and fnmatch.fnmatchcase(e.target, r.target)), None)
        if rule is None:
            bad.append(f"{e.where}: {e.importer} imports {e.target} inside a function; "
                       "import it at the top, or list it in tests/test_layers.py LAZY")
            continue
        used.add(rule)
        if rule.why == MLX and not _runs_mlx(e.target, module_edges, external):
            bad.append(f"{e.where}: {e.target} imports no mlx at import time, so the lazy "
                       "import keeps nothing out: import it at the top")
    bad += [f"LAZY entry {r} matches no import: remove it" for r in LAZY if r not in used]
    assert not bad, "\n".join(bad)
