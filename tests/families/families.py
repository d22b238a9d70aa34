"""The model families the end-to-end table runs: each one is a small random llama with the
starter's tokenizer (:func:`tests.helpers.tiny_world_model`) behind our own chat template of
the family (tests/data/families/<name>.jinja, written after the
family's published format), with unused special tokens of the starter's vocab renamed to
the family's control tokens, so that the family's markers are single special tokens as in
the real checkpoints (a forced call's grammar then writes them as those tokens:
kit.engine.decode.grammar.special_token_refs).

The starter's end-of-turn token (``<|im_end|>``, its EOS id) is renamed to the family's own
end-of-turn token, so a generated turn ends the way the template renders it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "families"

#: the starter's special tokens nothing in its ChatML template uses (free to rename)
SPARE = ("<repo_name>", "<reponame>", "<file_sep>", "<filename>", "<gh_stars>",
         "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
         "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>",
         "<empty_output>")


@dataclass(frozen=True)
class Family:
    """One row group of the table.

    Attributes:
        name: the template's file stem and the row's id.
        tool_format / reasoning_format: what kit.formats must select for it (and
            /v1/models report).
        tokens: the family's control tokens, given spare ids of the starter's vocab.
        eos / bos: the family's end-of-turn and begin-of-text tokens (the starter's
            ``<|im_end|>`` / ``<|im_start|>`` renamed), None to keep the starter's.
        call_id: the call ids the family's template accepts (a regex).
        thinking: template variables that turn reasoning on (a thinking family).
        keeps_reasoning: the template renders an assistant turn's reasoning back in a tool
            loop (after the last user turn); others drop it.
    """

    name: str
    tool_format: str | None
    reasoning_format: str | None
    tokens: tuple[str, ...] = ()
    eos: str | None = None
    bos: str | None = None
    call_id: str = r".+"
    thinking: dict = field(default_factory=dict)
    keeps_reasoning: bool = False

    @property
    def template(self) -> Path:
        return DATA / f"{self.name}.jinja"

    def renames(self) -> dict[str, str]:
        """Old token -> new token for :func:`tests.helpers.starter_with_template`."""
        assert len(self.tokens) <= len(SPARE), self.name
        out = dict(zip(SPARE, self.tokens))
        if self.eos:
            out["<|im_end|>"] = self.eos
        if self.bos:
            out["<|im_start|>"] = self.bos
        return out

    def id_ok(self, call_id: str) -> bool:
        return re.fullmatch(self.call_id, call_id) is not None


FAMILIES = (
    Family("qwen3", "json_tools", "think",
           ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
            "</tool_response>"), keeps_reasoning=True),
    Family("qwen3-coder", "qwen3_coder", None, ("<tool_call>", "</tool_call>",
                                                  "<tool_response>", "</tool_response>")),
    Family("glm47", "glm47", "think",
           ("<think>", "</think>", "<|system|>", "<|user|>", "<|assistant|>", "[gMASK]",
            "<sop>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
            "</arg_value>"), eos="<|observation|>", keeps_reasoning=True),
    Family("mistral", "mistral", "mistral",
           ("[THINK]", "[/THINK]", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]", "[ARGS]"), eos="</s>", bos="<s>", call_id=r"[A-Za-z0-9]{9}"),
    Family("kimi_k2", "kimi_k2", "think",
           ("<think>", "</think>", "<|im_system|>", "<|im_user|>", "<|im_assistant|>",
            "<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
            "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
           call_id=r"functions\.[\w.-]+:\d+", keeps_reasoning=True),
    Family("gemma4", "gemma4", "gemma",
           ("<|channel>", "<channel|>", "<|think|>", "<|tool>", "<tool|>", "<|tool_call>",
            "<|tool_response>", "<tool_response|>", "<tool_call|>", '<|"|>'),
           eos="<turn|>", bos="<|turn>", thinking={"enable_thinking": True}),
    Family("deepseek", "deepseek", "think",
           ("<think>", "</think>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
            "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
           eos="<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>"),
    Family("gpt-oss", "harmony", "harmony",
           ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
            "<|call|>"), eos="<|return|>", keeps_reasoning=True),
    Family("llama3_json", "llama3_json", None,
           ("<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>", "<|eom_id|>"),
           eos="<|eot_id|>", bos="<|begin_of_text|>"),
)
BY_NAME = {f.name: f for f in FAMILIES}


def family_model(hf_home: Path, folder: Path, family: Family,
                 weights: Path | None = None) -> Path:
    """The starter's weights, or ``weights``' (a folder with config.json and
    model.safetensors over the starter's vocabulary), behind ``family``'s template and
    control tokens (a folder of links; tokenizer files written). Renaming keeps every id,
    so the EOS id stays the starter's and only its text changes; the tokenizer config's
    named tokens follow."""
    from tests.helpers import starter_with_template

    renames = family.renames()
    starter_with_template(hf_home, folder, family.template, rename_tokens=renames)
    if weights is not None:
        for name in ("config.json", "model.safetensors"):
            (folder / name).unlink()
            (folder / name).symlink_to((weights / name).resolve())
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if config.get(key) in renames:
            config[key] = renames[config[key]]
    config_file.write_text(json.dumps(config))
    special = folder / "special_tokens_map.json"
    if special.exists():
        data = json.loads(special.read_text())
        text = json.dumps(data)
        for old, new in renames.items():
            text = text.replace(json.dumps(old), json.dumps(new))
        special.unlink()  # a link into the starter's snapshot: replaced, never written through
        special.write_text(text)
    return folder



