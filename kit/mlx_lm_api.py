"""The one boundary to mlx-lm: every name kit uses from it, public or private, goes through
this module, so an mlx-lm upgrade is one deliberate step (check :data:`NAMES` against the
new version, run the suite, add it to :data:`CHECKED` and pyproject.toml's bound).

Checked against mlx-lm :data:`CHECKED`; pyproject.toml bounds it to that minor version.
``tests/test_mlx_lm_api.py`` fails, naming each one, when a name in :data:`NAMES` is
missing from the installed mlx-lm.

Importing this module imports nothing of mlx-lm (nor mlx): a name is looked up when it is
used, ``mlx_lm_api.load`` imports ``mlx_lm`` then, and gives mlx-lm's object as it is at
that moment (a test's monkeypatch of ``mlx_lm.load`` is seen). The HTTP server's process
and the CLI commands that load no model never import mlx through it.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

#: mlx-lm versions this boundary (and the suite) was checked against.
CHECKED = ("0.32.2",)

#: mlx-lm module -> the names kit uses from it. Private names (a leading ``_``) are what
#: kit's family parsers reuse of mlx-lm's parsers; they are the likeliest to move.
NAMES: dict[str, tuple[str, ...]] = {
    "mlx_lm": ("load", "stream_generate"),
    "mlx_lm.generate": ("BatchGenerator", "TextStateMachine", "generation_stream",
                        "make_stop_sequences", "speculative_generate_step", "wired_limit"),
    "mlx_lm.models.cache": ("KVCache", "LRUPromptCache", "QuantizedKVCache",
                            "can_trim_prompt_cache", "load_prompt_cache",
                            "make_prompt_cache", "save_prompt_cache", "trim_prompt_cache"),
    "mlx_lm.sample_utils": ("make_logits_processors", "make_sampler"),
    "mlx_lm.utils": ("sharded_load",),
    "mlx_lm.tuner.utils": ("linear_to_lora_layers",),
    # load: a vision model's tokenizer, wrapped as mlx_lm.load wraps a text model's
    # (kit.engine.decode.vision; reached as load_tokenizer, mlx_lm's own load keeps the name)
    "mlx_lm.tokenizer_utils": ("TokenizerWrapper", "load"),
    # the parsers kit's formats build on (kit/formats/<name>.py)
    "mlx_lm.tool_parsers.gemma4": ("tool_call_end", "tool_call_start"),
    "mlx_lm.tool_parsers.glm47": ("_deserialize", "parse_tool_call", "tool_call_end",
                                  "tool_call_start"),
    "mlx_lm.tool_parsers.json_tools": ("parse_tool_call", "tool_call_end", "tool_call_start"),
    "mlx_lm.tool_parsers.kimi_k2": ("_parse_single_tool", "parse_tool_call", "tool_call_end",
                                    "tool_call_start"),
    "mlx_lm.tool_parsers.kimi_k3": ("_decode_value", "_parse_attrs", "tool_call_end",
                                    "tool_call_start"),
    "mlx_lm.tool_parsers.mistral": ("parse_tool_call", "tool_call_end", "tool_call_start"),
    "mlx_lm.tool_parsers.qwen3_coder": ("_convert_param_value", "_get_arguments_config",
                                        "_string_types", "tool_call_end", "tool_call_start"),
}

#: every tool-parser module mlx-lm ships (``mlx_lm/tool_parsers/``) in the :data:`CHECKED`
#: versions; each is reachable from a template or ``tool_parser_type`` in
#: tokenizer_config.json (:mod:`kit.formats.select`).
TOOL_PARSERS = ("function_gemma", "gemma4", "glm47", "json_tools", "kimi_k2", "kimi_k3",
                "laguna", "longcat", "minicpm5", "minimax_m2", "mistral", "muse_spark",
                "pythonic", "qwen3_coder")

#: the attribute of mlx-lm's ``TokenizerWrapper`` that holds the Hugging Face tokenizer
#: it wraps (private: mlx-lm exposes it no other way).
HF_TOKENIZER_ATTR = "_tokenizer"

# name -> its module, for the names used as ``mlx_lm_api.NAME`` (tool parsers' names,
# which repeat from module to module, are reached through tool_parser()).
_WHERE: dict[str, str] = {}
for _module, _names in NAMES.items():  # the first module naming it wins (mlx_lm's load)
    if not _module.startswith("mlx_lm.tool_parsers."):
        for _name in _names:
            _WHERE.setdefault(_name, _module)


def __getattr__(name: str) -> Any:
    """``mlx_lm_api.NAME``: mlx-lm's object of that name, imported now.

    Raises:
        AttributeError: ``NAME`` is not in :data:`NAMES` (add it there, checked).
    """
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (mlx-lm names "
                             "kit uses are listed in kit.mlx_lm_api.NAMES)")
    return getattr(importlib.import_module(module), name)


def tool_parser(name: str) -> ModuleType:
    """mlx-lm's tool-parser module ``name`` (one of :data:`TOOL_PARSERS`), imported now
    (imports mlx: the engine's process only).

    Raises:
        ValueError: mlx-lm ships no such parser (in the :data:`CHECKED` versions).
    """
    if name not in TOOL_PARSERS:
        raise ValueError(f"mlx-lm has no tool parser {name!r}")
    return importlib.import_module(f"mlx_lm.tool_parsers.{name}")


def load_tokenizer(path: Path, config_extra: dict[str, Any] | None = None,
                   eos_token_ids: Any = None) -> Any:
    """mlx-lm's ``tokenizer_utils.load``: the ``TokenizerWrapper`` of the tokenizer in
    ``path``, built as ``mlx_lm.load`` builds a text model's (its streaming detokenizer,
    ``eos_token_ids`` an int or a list from config.json)."""
    module = importlib.import_module("mlx_lm.tokenizer_utils")
    return module.load(path, config_extra, eos_token_ids=eos_token_ids)


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` ``tokenizer``."""
    return getattr(tokenizer, HF_TOKENIZER_ATTR)


def source_root() -> Path | None:
    """The folder of the installed mlx-lm package, found without importing it (a top-level
    ``find_spec`` runs no ``__init__``), or None when mlx-lm is not installed."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def missing() -> list[str]:
    """The names of :data:`NAMES` (``module.name``) the installed mlx-lm lacks, and each
    :data:`TOOL_PARSERS` module it does not ship; ``[]`` when all are there. Imports
    mlx-lm (and mlx)."""
    gone: list[str] = []
    for module, names in NAMES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            gone.append(module)
            continue
        gone += [f"{module}.{n}" for n in names if not hasattr(mod, n)]
    root = source_root()
    gone += [f"mlx_lm.tool_parsers.{p}" for p in TOOL_PARSERS
             if root is None or not (root / "tool_parsers" / f"{p}.py").is_file()]
    return gone
