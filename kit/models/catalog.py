"""Discovery: every model in the local Hugging Face cache that mlx-lm can load, plus the
starter, described from the model's own files (no mlx import, no model load).

Each entry says: id, size on disk, quantization, context window, capabilities (tool calls,
reasoning, vision, read from the chat template, tokenizer and config) — or, for an entry
that cannot be served, why not.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kit.models.resolve import read_context_window
from kit.models.starter import STARTER_VARIANTS, starter_path

# Markers that show a chat template renders tool calls / reasoning.
_TOOL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|tool_call", "tool_calls", "<function=",
                 "<|python_tag|>")
_THINK_MARKERS = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")


@dataclass(frozen=True)
class Capabilities:
    """What a model can do, judged from its files."""

    tools: bool = False
    reasoning: bool = False
    vision: bool = False


@dataclass(frozen=True)
class CatalogEntry:
    """One model on this machine.

    Attributes:
        id: hub repo id (or folder path).
        path: snapshot folder, None for a starter variant not built yet.
        size_bytes: bytes on disk (0 if unknown).
        quantization: e.g. ``"4-bit g32"``, ``"float32"``, ``"bfloat16"``.
        context_window: tokens, None if unknown.
        capabilities: tools / reasoning / vision.
        model_type: config.json's model_type.
        loadable: whether mlx-kit can serve it; ``reason`` says why not.
        note: extra information (e.g. "built on first use").
    """

    id: str
    path: Path | None
    size_bytes: int = 0
    quantization: str | None = None
    context_window: int | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    model_type: str | None = None
    loadable: bool = True
    reason: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path) if self.path else None
        return d


@lru_cache(maxsize=1)
def _mlx_lm_models() -> tuple[Path | None, dict[str, str]]:
    """mlx-lm's models folder and its model_type remapping, read without importing mlx-lm
    (importing it imports mlx, which a listing command must not pay for)."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None, {}
    root = Path(next(iter(spec.submodule_search_locations)))
    remap: dict[str, str] = {}
    try:
        tree = ast.parse((root / "utils.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets):
                remap = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError):
        pass
    return root / "models", remap


def _supported(model_type: str) -> bool:
    models, remap = _mlx_lm_models()
    return models is not None and (models / f"{remap.get(model_type, model_type)}.py").is_file()


def _chat_template(folder: Path) -> str:
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            return (folder / name).read_text(errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            value = json.loads((folder / name).read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, list):  # named templates
            value = " ".join(str(t.get("template", "")) for t in value if isinstance(t, dict))
        if value:
            return str(value)
    return ""


def capabilities(folder: Path, config: dict[str, Any]) -> Capabilities:
    """Tool calls, reasoning, vision, judged from the chat template, tokenizer and config."""
    template = _chat_template(folder)
    try:
        special = (folder / "tokenizer.json").read_text(errors="replace")[:2_000_000] \
            if (folder / "tokenizer.json").is_file() else ""
    except OSError:
        special = ""
    return Capabilities(
        tools=any(m in template for m in _TOOL_MARKERS) or "tools" in template,
        reasoning=any(m in template for m in _THINK_MARKERS) or '"<think>"' in special,
        vision="vision_config" in config or (folder / "preprocessor_config.json").is_file(),
    )


def quantization(config: dict[str, Any]) -> str:
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and q.get("bits"):
        return f"{q['bits']}-bit g{q.get('group_size', '?')}"
    return str(config.get("torch_dtype") or config.get("dtype") or "unknown")


def _folder_size(folder: Path) -> int:
    total = 0
    for f in folder.rglob("*"):
        try:
            if f.is_file():
                total += f.stat().st_size  # follows the snapshot's symlinks to the blobs
        except OSError:
            pass
    return total


def describe(model_id: str, folder: Path, size_bytes: int | None = None) -> CatalogEntry:
    """Describe the model in ``folder`` from its files; never raises."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return CatalogEntry(model_id, folder, size_bytes or 0, loadable=False,
                            reason="no config.json")
    except (OSError, ValueError) as e:
        return CatalogEntry(model_id, folder, size_bytes or 0, loadable=False,
                            reason=f"unreadable config.json: {e}")
    size = _folder_size(folder) if size_bytes is None else size_bytes
    base = dict(id=model_id, path=folder, size_bytes=size, quantization=quantization(config),
                context_window=read_context_window(folder, default=0) or None,
                capabilities=capabilities(folder, config), model_type=config.get("model_type"))
    if not any(folder.glob("*.safetensors")):
        reason = "no .safetensors weights" + (" (GGUF/PyTorch only?)" if any(
            folder.glob("*.gguf")) or any(folder.glob("*.bin")) else "")
        return CatalogEntry(**base, loadable=False, reason=reason)
    if not config.get("model_type"):
        return CatalogEntry(**base, loadable=False, reason="config.json has no model_type")
    if not _supported(config["model_type"]):
        return CatalogEntry(**base, loadable=False,
                            reason=f"model_type {config['model_type']!r} not supported by mlx-lm")
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model",
                                                  "tokenizer_config.json")):
        return CatalogEntry(**base, loadable=False, reason="no tokenizer files")
    return CatalogEntry(**base)


def api_entry(model_id: str, entry: CatalogEntry | None, *, real_id: str,
              context_window: int | None = None, loaded: bool = False) -> dict[str, Any]:
    """One /v1/models entry (also what harness templates bake): ``model_id`` is what
    agents send (``local`` or a real id), ``real_id`` the model it names. Fields:
    id, name, model, context_window, max_tokens (a suggested output cap: a quarter of the
    window, 256..8192), capabilities, quantization, size_bytes, loaded."""
    window = context_window or (entry.context_window if entry else None) or 4096
    caps = entry.capabilities if entry else Capabilities()
    return {"id": model_id, "name": f"{real_id} (mlx-kit)" if model_id != real_id else real_id,
            "model": real_id, "context_window": window,
            "max_tokens": max(256, min(8192, window // 4)),
            "capabilities": {"tools": caps.tools, "reasoning": caps.reasoning,
                             "vision": caps.vision},
            "quantization": entry.quantization if entry else None,
            "size_bytes": entry.size_bytes if entry else None, "loaded": loaded}


def scan() -> list[CatalogEntry]:
    """The starter variants (built or not) and every model repo in the hub cache."""
    entries: dict[str, CatalogEntry] = {}
    for repo_id in STARTER_VARIANTS:
        path = starter_path(repo_id)
        entries[repo_id] = describe(repo_id, path) if path else CatalogEntry(
            repo_id, None, note="embedded starter; built on first use (~5 s)",
            quantization="4-bit g32" if repo_id.endswith("4bit") else "float32",
            context_window=8192)
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache yet or unreadable: only the starter
        return list(entries.values())
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or repo.repo_id in entries:
            continue
        revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        main = next((r for r in revisions if "main" in r.refs), revisions[0] if revisions else None)
        if main is None:
            entries[repo.repo_id] = CatalogEntry(repo.repo_id, None, repo.size_on_disk,
                                                 loadable=False, reason="no snapshot")
            continue
        entries[repo.repo_id] = describe(repo.repo_id, Path(main.snapshot_path), main.size_on_disk)
    return list(entries.values())
