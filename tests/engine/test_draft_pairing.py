"""Speculative decoding's rules without a model (kit/engine/decode/draft.py): which target
a ``--draft-model`` value pairs with, the tokenizer check that refuses a draft at start
naming both models, which requests draft, and how acceptance is counted. With the real
starter pair: tests/server/test_draft_model.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.engine.decode.draft import Drafts, check_same_tokenizer, parse_pairings
from kit.engine.types import ChatRequest
from kit.errors import ConfigError
from kit.models.resolve import ModelInfo


def model_folder(root: Path, name: str, words: list[str]) -> Path:
    """A folder that resolves as a model: config.json and a word-level tokenizer.json."""
    from tokenizers import Tokenizer, models

    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    vocab = {w: i for i, w in enumerate(words)}
    Tokenizer(models.WordLevel(vocab, unk_token=words[0])).save(str(folder / "tokenizer.json"))
    return folder


def test_a_bare_draft_pairs_with_the_started_model_and_target_pairs_name_theirs():
    assert parse_pairings(("small",), "big") == {"big": "small"}
    assert parse_pairings(("a=a-small", "small", "b=b-small"), "big") == {
        "a": "a-small", "big": "small", "b": "b-small"}
    with pytest.raises(ConfigError, match="TARGET=DRAFT"):
        parse_pairings(("big=",), "big")
    # two drafts for one model: refused, not the last one silently (a new user's trial)
    with pytest.raises(ConfigError, match="pairs big with both small and tiny"):
        parse_pairings(("big=small", "big=tiny"), "big")


def test_a_folder_target_pairs_under_the_id_it_loads_with(tmp_path, monkeypatch):
    folder = model_folder(tmp_path, "m", ["<unk>", "a"])
    monkeypatch.chdir(tmp_path)
    assert parse_pairings(("m=d",), "x") == {str(folder.resolve()): "d"}


def serve_says(tmp_path, *args: str) -> str:
    """stderr of ``mlx-kit serve ARGS`` that refuses to start (whitespace collapsed)."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "kit", "serve", "--port", "18765", *args],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    return " ".join(r.stderr.split())


def test_serve_refuses_a_target_that_is_not_on_this_machine_and_a_vision_model(tmp_path):
    target = model_folder(tmp_path, "target", ["<unk>", "a", "b"])
    said = serve_says(tmp_path, "--model", str(target), "--draft-model",
                      f"nope/x={target}")
    assert "--draft-model nope/x=" in said and "not found" in said
    # a bare draft is named as typed, not as the TARGET=DRAFT pairing it becomes
    said = serve_says(tmp_path, "--model", str(target), "--draft-model", "nope/draft")
    assert "--draft-model nope/draft: " in said and "not found" in said, said
    vlm = model_folder(tmp_path, "vlm", ["<unk>", "a", "b"])
    (vlm / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl",
                                                 "vision_config": {"depth": 1}}))
    said = serve_says(tmp_path, "--model", str(vlm), "--draft-model", str(target))
    assert f"{vlm} is a vision model" in said


def test_a_draft_with_another_tokenizer_is_refused_naming_both(tmp_path):
    target = model_folder(tmp_path, "target", ["<unk>", "a", "b", "c"])
    same = model_folder(tmp_path, "same", ["<unk>", "a", "b", "c"])
    other = model_folder(tmp_path, "other", ["<unk>", "a", "c", "b"])
    t = ModelInfo("org/target", target, None)
    check_same_tokenizer(t, ModelInfo("org/same", same, None))  # no error
    with pytest.raises(ConfigError) as e:
        check_same_tokenizer(t, ModelInfo("org/other", other, None))
    assert "org/other's tokenizer differs from org/target's" in e.value.message
    assert "2 differ, e.g. 'b' is 2 in the target and 3 in the draft" in e.value.message


def test_serve_refuses_a_mismatched_draft_before_the_engine_starts(tmp_path):
    target = model_folder(tmp_path, "target", ["<unk>", "a", "b"])
    other = model_folder(tmp_path, "other", ["<unk>", "a", "b", "extra"])
    said = serve_says(tmp_path, "--model", str(target), "--draft-model", str(other))
    assert f"{other}'s tokenizer differs from {target}'s" in said


def test_requests_with_a_grammar_never_draft():
    drafts = Drafts({"m": "d"})
    drafts.loaded = loaded = object()
    assert drafts.usable(ChatRequest([{"role": "user", "content": "hi"}])) is loaded
    assert drafts.usable(ChatRequest([], force_tool="")) is None
    assert drafts.usable(ChatRequest([], response_schema={"type": "object"})) is None


def test_acceptance_counts_each_step_as_its_proposals():
    drafts = Drafts({"m": "d"}, num_draft_tokens=3)
    # step 1: 3 proposals kept + the model's own; step 2: 1 kept + the model's own
    drafts.count([True, True, True, False, True, False])
    assert (drafts.drafted, drafts.accepted) == (6, 4)
    status = drafts.status()
    assert status["acceptance"] == round(4 / 6, 4) and status["model"] is None
    assert Drafts({}).status() is None
