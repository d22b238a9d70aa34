"""What mlx-lm can split, read from its source without importing it (importing mlx_lm
imports mlx, which the HTTP process and model-free CLI commands must not load).

mlx-lm has no capability table: ``sharded_load`` asks the built model ``hasattr(model,
"shard")`` (tensor parallelism) and ``hasattr(model.model, "pipeline")`` (pipeline), which
needs mlx. So this reads the same answer from its source with ``ast``: the ``Model`` class
(followed through its bases and re-exports across modules) defines ``shard``; the class
behind ``self.model`` (an ``__init__`` assignment, or a ``model`` property returning
``self.a.b``) defines ``pipeline`` or inherits it (``PipelineMixin``). Checked against
mlx-lm 0.32.2: ``shard`` gives the same answer as ``hasattr(Model, "shard")`` on the
imported class of every model module, and ``pipeline`` finds every module that uses
PipelineMixin or defines ``pipeline`` (plus those inheriting it from another module).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from kit import mlx_lm_api
from kit.errors import ModelError

_MODULE = re.compile(r"[A-Za-z0-9_]{1,64}")


class SplitError(ModelError):
    """The model cannot be split over the ranks asked for: a rank count out of range, a
    model type mlx-lm cannot split that way, a dimension the rank count does not divide,
    or files pipeline loading needs. ``hint`` says what would work."""


@lru_cache(maxsize=1)
def _mlx_lm_root() -> Path | None:
    # found without executing mlx-lm's __init__; a test checks mlx stays unimported
    return mlx_lm_api.source_root()


@lru_cache(maxsize=256)
def _module(name: str) -> ast.Module | None:
    root = _mlx_lm_root()
    if root is None or not _MODULE.fullmatch(name):
        return None
    try:
        return ast.parse((root / "models" / f"{name}.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None


@lru_cache(maxsize=1)
def _remappings() -> tuple[dict, dict]:
    """mlx-lm's MODEL_REMAPPING and MODEL_ARCHITECTURE_REMAPPING (utils.py), read as text."""
    found: dict[str, dict] = {}
    try:
        tree = ast.parse((_mlx_lm_root() / "utils.py").read_text())  # type: ignore[operator]
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                    found[node.targets[0].id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError, TypeError):
        pass
    return found.get("MODEL_REMAPPING", {}), found.get("MODEL_ARCHITECTURE_REMAPPING", {})


def _module_name(config: dict) -> str:
    """mlx-lm's module for ``config`` (its ``_get_classes`` rules)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not _MODULE.fullmatch(model_type):
        raise SplitError(f"config.json's model_type {str(model_type)[:40]!r} is not one "
                         "mlx-lm knows")
    remap, arch_remap = _remappings()
    archs = config.get("architectures") or ()
    archs = (archs,) if isinstance(archs, str) else archs if isinstance(archs, list) else ()
    for arch in archs:
        if isinstance(arch, str) and (model_type, arch) in arch_remap:
            return arch_remap[(model_type, arch)]
    return remap.get(model_type, model_type)


def _find_class(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The class ``name`` seen from ``module``: defined there or imported (``from .x
    import Y as name``, ``x.Y``)."""
    tree = _module(module)
    if tree is None or depth > 8:
        return None
    if "." in name:  # `qwen3_5.Model`: a module imported with `from . import qwen3_5`
        alias, _, attr = name.partition(".")
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
                for a in node.names:
                    if (a.asname or a.name) == alias:
                        return _find_class(a.name, attr, depth + 1)
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for a in node.names:
                if (a.asname or a.name) == name:
                    return _find_class(node.module, a.name, depth + 1)
    return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _mro(module: str, cls: ast.ClassDef, depth: int = 0):
    """``(module, class)`` for ``cls`` and its bases that live in mlx-lm's models."""
    yield module, cls
    for base in cls.bases:
        found = _find_class(module, _dotted(base) or "") if depth < 8 else None
        if found:
            yield from _mro(*found, depth + 1)


def _has_method(found: tuple[str, ast.ClassDef] | None, method: str) -> bool:
    return found is not None and any(
        isinstance(n, ast.FunctionDef) and n.name == method
        for _, c in _mro(*found) for n in c.body)


def _attribute_class(found: tuple[str, ast.ClassDef] | None, attr: str,
                     depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The class of ``instance.attr`` for an instance of ``found``."""
    if found is None or depth > 4:
        return None
    for module, cls in _mro(*found):
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            if fn.name == "__init__":
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                            and any(isinstance(t, ast.Attribute) and t.attr == attr
                                    and isinstance(t.value, ast.Name) and t.value.id == "self"
                                    for t in node.targets)):
                        return _find_class(module, _dotted(node.value.func) or "")
            elif fn.name == attr and fn.body and isinstance(fn.body[-1], ast.Return):
                # a property `return self.language_model.model`: follow the chain
                chain, node = [], fn.body[-1].value
                while isinstance(node, ast.Attribute):
                    chain.insert(0, node.attr)
                    node = node.value
                if isinstance(node, ast.Name) and node.id == "self" and chain:
                    target = (module, cls)
                    for step in chain:
                        target = _attribute_class(target, step, depth + 1)
                    return target
    return None


def capabilities(config: dict) -> tuple[str, bool, bool]:
    """``(module, tensor, pipeline)``: mlx-lm's module for ``config`` and whether its
    model can be split by tensor parallelism / by pipeline.

    Raises:
        SplitError: mlx-lm is not installed, or has no module for the model type.
    """
    if _mlx_lm_root() is None:
        raise SplitError("mlx-lm is not installed, so no model can be split",
                         hint="pip install mlx-lm")
    name = _module_name(config)
    model = _find_class(name, "Model")
    if model is None:
        raise SplitError(f"mlx-lm has no model type {config.get('model_type')!r}")
    return name, _has_method(model, "shard"), _has_method(_attribute_class(model, "model"),
                                                          "pipeline")
