"""Discovery: every model in the local Hugging Face cache that mlx-lm (or, for a vision
model, mlx-vlm) can load, plus the starter, described from the model's own files (no mlx
import, no model load).

Each entry says: id, size on disk, quantization, context window, capabilities (tool calls,
reasoning, vision, read from the chat template, tokenizer and config) — or, for an entry
that cannot be served, why not. :func:`served_entries` is the one list a server shows at
/v1/models (``local`` first); :class:`CatalogCache` serves :func:`scan`'s last snapshot and
rescans in a background thread, so a server's event loop never walks the cache.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kit import STABLE_MODEL_ID, mlx_lm_api
from kit.formats.select import detect, template_text
from kit.models.model_config import read_context_window
from kit.models.starter import STARTER_ID, STARTER_VARIANTS, starter_path
from kit.models.vision import audio_model_type, mlx_vlm_installed, vision_model_type

log = logging.getLogger("mlx_kit.catalog")

#: a special token's text in tokenizer.json's ``added_tokens``
_ADDED_TOKEN = re.compile(r'"content"\s*:\s*"((?:[^"\\]|\\.)*)"')
_TOKENIZER_HEAD_CHARS = 2_000_000  # most of tokenizer.json ever read (special tokens lead)
_CHUNK = 64 * 1024
#: seconds a catalog snapshot is served before a read starts a rescan (in the background)
CATALOG_TTL_S = 10.0


@dataclass(frozen=True)
class Capabilities:
    """What a model can do, judged from its files."""

    tools: bool = False
    reasoning: bool = False
    vision: bool = False
    audio: bool = False
    tool_format: str | None = None
    reasoning_format: str | None = None


@dataclass(frozen=True)
class CatalogEntry:
    """One model on this machine.

    Attributes:
        id: hub repo id (or folder path).
        path: snapshot folder, None for a starter variant not built yet.
        size_bytes: bytes on disk (0 if unknown).
        quantization: e.g. ``"4-bit g32"``, ``"float32"``, ``"bfloat16"``.
        context_window: tokens, None if unknown.
        capabilities: tools / reasoning / vision / audio.
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
    root = mlx_lm_api.source_root()
    if root is None:
        return None, {}
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


def _unsupported(config: dict[str, Any]) -> str:
    """Why a model whose model_type neither mlx-lm nor mlx-vlm loads cannot be served."""
    reason = f"model_type {config['model_type']!r} not supported by mlx-lm"
    if config.get("vision_config") is None:
        return reason
    if mlx_vlm_installed():
        return reason + " or mlx-vlm"
    return reason + " (a vision model: pip install 'mlx-kit[vision]' adds mlx-vlm)"


def _chat_template(folder: Path) -> str:
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            return (folder / name).read_text(errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            value = json.loads((folder / name).read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        value = template_text(value)  # named templates joined, as the engine reads them
        if value:
            return value
    return ""


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _special_tokens(path: Path) -> set[str]:
    """The special tokens of ``tokenizer.json`` (from :func:`_special_tokens_head`)."""
    found = set()
    for raw in _ADDED_TOKEN.findall(_special_tokens_head(path)):
        try:
            found.add(json.loads(f'"{raw}"'))
        except ValueError:
            continue
    return found


def _special_tokens_head(path: Path, limit: int = _TOKENIZER_HEAD_CHARS) -> str:
    """The head of ``tokenizer.json`` that holds its special tokens: read in chunks until
    the end of ``added_tokens`` (the ``"normalizer"`` key that the tokenizers library
    writes next) or ``limit`` characters, never the whole file (tens of MB for large
    vocabularies, and the catalog is rescanned every few seconds). ``""`` if unreadable."""
    seen = ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            while len(seen) < limit:
                chunk = f.read(min(_CHUNK, limit - len(seen)))
                if not chunk:
                    break
                seen += chunk
                at = seen.find('"added_tokens"')
                if at >= 0 and seen.find('"normalizer"', at) >= 0:
                    break
    except OSError:
        return ""
    return seen


def capabilities(folder: Path, config: dict[str, Any]) -> Capabilities:
    """Tool calls, reasoning, vision, judged from the chat template, the special tokens at
    the head of tokenizer.json (:func:`kit.formats.detect`: the same rules the engine's
    parser is built from) and config. ``tools`` means tool calls are *parsed*: a template
    that renders tools in a format no parser reads says False. ``vision`` means images
    are *read*: a model mlx-vlm loads as a vision model (:mod:`kit.models.vision`);
    ``audio``: such a model with an audio tower."""

    template = _chat_template(folder)
    tokenizer = folder / "tokenizer.json"
    special = _special_tokens(tokenizer) if tokenizer.is_file() else set()
    configured = _tokenizer_config(folder).get("tool_parser_type")
    found = detect(template, special, configured if isinstance(configured, str) else None)
    return Capabilities(
        tools=found.tool_format is not None, reasoning=found.reasoning_format is not None,
        vision=vision_model_type(config), audio=audio_model_type(config),
        tool_format=found.tool_format, reasoning_format=found.reasoning_format,
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
    if not (_supported(config["model_type"]) or base["capabilities"].vision):
        return CatalogEntry(**base, loadable=False, reason=_unsupported(config))
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
                             "vision": caps.vision, "audio": caps.audio,
                             "tool_format": caps.tool_format,
                             "reasoning_format": caps.reasoning_format},
            "quantization": entry.quantization if entry else None,
            "size_bytes": entry.size_bytes if entry else None, "loaded": loaded}


def scan() -> list[CatalogEntry]:
    """The starter variants (built or not) and every model repo in the hub cache."""
    entries: dict[str, CatalogEntry] = {}
    for repo_id in STARTER_VARIANTS:
        path = starter_path(repo_id)
        entries[repo_id] = describe(repo_id, path) if path else CatalogEntry(
            repo_id, None, note="embedded starter; built on first use (~5-30 s)",
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


def cached_model_ids() -> list[str]:
    """Repo ids in the local hub cache whose snapshot has a config.json (candidates for
    MLX), from :func:`scan`."""
    return sorted(e.id for e in scan() if e.path is not None and e.reason != "no config.json")


def served_entries(catalog: Iterable[CatalogEntry], model_id: str = STARTER_ID, *,
                   context_window: int | None = None, loaded: bool = False,
                   detected: Mapping[str, bool] | None = None) -> list[dict[str, Any]]:
    """The models a server on ``model_id`` lists at /v1/models (and what harness templates
    bake when no server answers): ``local`` naming ``model_id`` first, then ``model_id``
    itself, then every other loadable model of ``catalog``. Entries are :func:`api_entry`
    dicts.

    Args:
        catalog: :func:`scan`'s entries (or a :class:`CatalogCache` snapshot).
        model_id: the model behind ``local`` (a server's loaded model; default the starter,
            what a server started now would load).
        context_window: the loaded model's window in tokens (default: the catalog's).
        loaded: whether that model is in memory now.
        detected: capabilities the engine detected on the loaded model (``tools``,
            ``reasoning``, ``vision``); they beat the catalog's guess from its files.
    """
    by_id = {e.id: e for e in catalog}
    head = [api_entry(mid, by_id.get(model_id), real_id=model_id,
                      context_window=context_window, loaded=loaded)
            for mid in (STABLE_MODEL_ID, model_id)]
    if detected:
        for entry in head:
            entry["capabilities"] = {**entry["capabilities"], **detected}
    return head + [api_entry(e.id, e, real_id=e.id) for e in by_id.values()
                   if e.loadable and e.id != model_id]


class CatalogCache:
    """The catalog as a snapshot that readers get at once, rescanned in a background
    thread (the scan walks the hub cache and reads every model's config and template:
    on a server's event loop it would stall every open stream).

    A read of a snapshot older than ``ttl`` seconds starts one rescan and still returns
    the old snapshot; the next read after the rescan gets the new one. Thread-safe.

    Args:
        scanner: what produces the entries (default :func:`scan`).
        ttl: seconds a snapshot is fresh, counted from the start of the scan that made it.
    """

    def __init__(self, scanner: Callable[[], list[CatalogEntry]] | None = None,
                 ttl: float = CATALOG_TTL_S) -> None:
        self._scan_fn = scanner or scan
        self.ttl = ttl
        self._lock = threading.Lock()
        self._snapshot: tuple[float, list[CatalogEntry]] | None = None  # (started, entries)
        self._running: concurrent.futures.Future | None = None

    def refresh(self, force: bool = False) -> concurrent.futures.Future:
        """Start a rescan unless one is running (``force``: start one anyway, e.g. after a
        swap built a starter that the running scan may have missed).

        Returns:
            A future of the newest snapshot once this rescan ended (its exception if the
            scan raised; the previous snapshot stays served then).
        """
        with self._lock:
            if self._running is not None and not self._running.done() and not force:
                return self._running
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._running = future
        threading.Thread(target=self._rescan, args=(future, time.monotonic()),
                         name="mlx-kit-catalog", daemon=True).start()
        return future

    def peek(self) -> list[CatalogEntry] | None:
        """The last snapshot without waiting (None before the first scan ended); starts a
        rescan when it is older than ``ttl`` (or there is none)."""
        snapshot = self._snapshot
        if snapshot is None or time.monotonic() - snapshot[0] > self.ttl:
            self.refresh()
        return snapshot[1] if snapshot is not None else None

    def when_ready(self) -> concurrent.futures.Future:
        """A future of the last snapshot: done at once if there is one (see :meth:`peek`),
        else the first scan's (await it with ``asyncio.wrap_future``)."""
        entries = self.peek()
        if entries is None:
            running = self._running  # the scan peek found or started
            assert running is not None
            return running
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(entries)
        return done

    def get(self, timeout: float | None = None) -> list[CatalogEntry]:
        """The last snapshot; before the first one exists, blocks until the scan ends.

        Raises:
            TimeoutError: no snapshot after ``timeout`` seconds.
            Exception: what the first scan raised.
        """
        return self.when_ready().result(timeout)

    def _rescan(self, future: concurrent.futures.Future, started: float) -> None:
        try:
            entries = self._scan_fn()
        except Exception as e:  # keep serving the last snapshot; the next read retries
            log.exception("the model catalog scan failed")
            future.set_exception(e)
            return
        with self._lock:  # a later-started scan that ended first is newer: keep it
            if self._snapshot is None or self._snapshot[0] <= started:
                self._snapshot = (started, entries)
            newest = self._snapshot[1]
        future.set_result(newest)
