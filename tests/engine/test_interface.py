"""The engine seam: Engine and EngineProcess both satisfy EngineLike, by method names and
signatures (not only what ``runtime_checkable`` looks at: names). Model-free: neither
engine is started."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kit.engine.decode.engine import Engine
from kit.engine.interface import EngineLike
from kit.engine.proc.process import EngineProcess
from kit.engine.distributed.world_process import DistributedEngine
from kit.models.resolve import ModelInfo

INFO = ModelInfo("some/model", Path("/nonexistent"), 4096)


def _protocol_methods() -> dict[str, object]:
    return {name: member for name, member in vars(EngineLike).items()
            if callable(member) and not name.startswith("_")}


def _calling(fn: object) -> str:
    """How a caller uses ``fn``: ``await`` it, ``async for`` over it, or call it."""
    if inspect.isasyncgenfunction(fn):
        return "async for"
    if inspect.iscoroutinefunction(fn):
        return "await"
    ret = inspect.signature(fn).return_annotation
    return "async for" if str(ret).startswith("AsyncIterator") else "call"


def _incompatibilities(proto: object, impl: object) -> list[str]:
    """What makes ``impl`` unusable where ``proto``'s signature is promised."""
    p, i = inspect.signature(proto), inspect.signature(impl)
    problems = []
    if _calling(proto) != _calling(impl):
        problems.append(f"called with {_calling(proto)!r}, implemented as {_calling(impl)!r}")
    if p.return_annotation != i.return_annotation:
        problems.append(f"returns {i.return_annotation}, not {p.return_annotation}")
    for name, pp in p.parameters.items():
        ip = i.parameters.get(name)
        if ip is None:
            problems.append(f"no parameter {name!r}")
            continue
        if ip.kind != pp.kind or ip.annotation != pp.annotation:
            problems.append(f"parameter {name!r} is {ip}, not {pp}")
        if pp.default is not inspect.Parameter.empty and ip.default != pp.default:
            problems.append(f"parameter {name!r} defaults to {ip.default!r}")
    for name, ip in i.parameters.items():
        if name not in p.parameters and ip.default is inspect.Parameter.empty \
                and ip.kind not in (ip.VAR_POSITIONAL, ip.VAR_KEYWORD):
            problems.append(f"extra required parameter {name!r}")
    return problems


def test_the_protocol_documents_every_method():
    methods = _protocol_methods()
    assert {"start", "wait_ready", "stop", "generate", "count_tokens", "swap", "memory",
            "current_memory", "capabilities"} <= set(methods)
    assert all(inspect.getdoc(m) for m in methods.values())
    doc = inspect.getdoc(EngineLike)
    assert "distributed" in doc and "Pipeline" in doc  # what followers would mirror


@pytest.mark.parametrize("cls", [Engine, EngineProcess, DistributedEngine])
def test_every_engine_satisfies_engine_like_by_names_and_signatures(cls):
    problems = {name: _incompatibilities(proto, getattr(cls, name, None) or proto)
                for name, proto in _protocol_methods().items()}
    missing = [name for name in _protocol_methods() if not hasattr(cls, name)]
    assert not missing
    assert not {name: p for name, p in problems.items() if p}
    assert isinstance(cls.pid, property)

    if cls is DistributedEngine:  # not started: no rank, no process
        from kit.engine.distributed.hosts import plan_world

        engine = cls(INFO, plan_world(3, None, None, None, False, 300))
    else:
        engine = cls(INFO)  # not started: no model, no process
    assert isinstance(engine, EngineLike)
    absent = [a for a in EngineLike.__annotations__ if not hasattr(engine, a)]
    assert not absent
    assert engine.model_info is INFO and engine.state == "loading" and engine.restarts == 0


def test_a_signature_that_drifts_is_caught():
    # the checker itself: a sync swap, a renamed argument, a required extra argument
    class Drifted:
        def swap(self, spec: str) -> SwapResult: ...  # noqa: F821 (string annotation)

        def count_tokens(self, req: ChatRequest) -> int: ...  # noqa: F821

        def wait_ready(self, timeout: float | None, strict: bool) -> bool: ...

    protocol = _protocol_methods()
    assert _incompatibilities(protocol["swap"], Drifted.swap)
    assert _incompatibilities(protocol["count_tokens"], Drifted.count_tokens)
    assert _incompatibilities(protocol["wait_ready"], Drifted.wait_ready)


def test_no_engine_module_reaches_into_another_objects_private_members():
    # the parts talk through documented interfaces (review A15: batch.py used six private
    # members of Engine); the one exception is mlx-lm's TokenizerWrapper._tokenizer, the
    # Hugging Face tokenizer it wraps and does not expose otherwise
    import ast

    engine_dir = Path(__file__).resolve().parents[2] / "kit" / "engine"
    reaches = []
    for path in sorted(engine_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.attr != "_tokenizer" \
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls")) \
                    and ast.unparse(node) != "os._exit" \
                    and not ast.unparse(node.value) == "super()":
                reaches.append(f"{path.relative_to(engine_dir)}:{node.lineno} {ast.unparse(node)}")
    assert not reaches
