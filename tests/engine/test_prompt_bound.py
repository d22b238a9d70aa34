"""The token-count lower bound: never above the real count, for real tokenizers.

The starter's tokenizer is the real SmolLM2 one; the others are real ``tokenizers``
pipelines in the shapes of Llama 2 (Prepend/Replace + byte fallback), Mistral (Metaspace +
byte fallback), Qwen 2 (NFC + Split + ByteLevel) and Llama 3 (Split + ByteLevel), trained
here on a small corpus (no other model is available offline).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
    pre_tokenizers, trainers

from kit.engine.decode.prompt_bound import TokenBound

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3,
          "def main():\n    return 42  # the answer\n", "=" * 64, " " * 48 + "x",
          "café naïve 日本語のテキスト 🙂 über straße", "1234567890 " * 4,
          "▁▁ marker ▁ in the input", "<|im_start|>user\nhello<|im_end|>"]
# hypothesis draws texts from pieces a tokenizer treats differently: long runs that some
# vocabulary entry covers whole, special-token text, combining marks NFC composes
PIECES = st.sampled_from(["the", " the", "  ", " " * 30, "\n", "\n\n", "\t", "=" * 20, "#",
                          "-", "1", "42", "é", "e\u0301", "日本", "🙂", "▁", "<0x41>",
                          "<|im_start|>", "<|im_end|>", "'s", "x", "Ünïcödé", "\u00a0"])
TEXTS = st.one_of(st.lists(PIECES, max_size=60).map("".join),
                  st.text(max_size=200),
                  st.tuples(PIECES, st.integers(1, 400)).map(lambda t: t[0] * t[1]))


def _train(tok: Tokenizer, byte_level: bool = False) -> Tokenizer:
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [],
        show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def _byte_fallback_vocab(tok: Tokenizer) -> Tokenizer:
    """The trained vocabulary plus the 256 ``<0xNN>`` tokens byte fallback needs."""
    import json

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def llama2() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return _byte_fallback_vocab(_train(tok))


def mistral() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    return _byte_fallback_vocab(_train(tok))


def qwen2() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _train(tok, byte_level=True)


def llama3() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _train(tok, byte_level=True)


@pytest.fixture(scope="module")
def starter(hf_home):
    from huggingface_hub import snapshot_download

    from kit.models.starter import STARTER_ID

    folder = snapshot_download(STARTER_ID, cache_dir=Path(hf_home) / "hub",
                               local_files_only=True)
    tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return tok, TokenBound.from_tokenizer(tok)


TRAINED = {"llama2": llama2, "mistral": mistral, "qwen2": qwen2, "llama3": llama3}


@pytest.fixture(scope="module", params=sorted(TRAINED))
def trained(request):
    tok = TRAINED[request.param]()
    bound = TokenBound.from_tokenizer(tok)
    assert bound is not None, f"{request.param}: its pipeline should allow a bound"
    return tok, bound


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXTS)
def test_the_bound_never_exceeds_the_starters_token_count(starter, text):
    tok, bound = starter
    assert bound is not None
    n = len(tok.encode(text, add_special_tokens=False).ids)
    assert bound.at_least(text) <= n


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXTS)
def test_the_bound_never_exceeds_the_count_of_other_tokenizer_pipelines(trained, text):
    tok, bound = trained
    assert bound.at_least(text) <= len(tok.encode(text, add_special_tokens=False).ids)


def test_metaspace_markers_typed_in_the_input_do_not_break_the_bound(trained):
    # A marker in the input is three bytes where one that replaced a space is one byte;
    # both readings of each vocabulary entry count.
    tok, bound = trained
    for text in ["▁" * 500, "▁a" * 300, "▁ " * 300, " ▁the" * 200]:
        assert bound.at_least(text) <= len(tok.encode(text).ids)


def test_the_bound_grows_with_the_text_so_huge_prompts_are_decided_by_it(starter):
    tok, bound = starter
    english = Path(__file__).read_text()
    n = len(tok.encode(english).ids)
    # within a small factor of the real count for prose and code (the window x this
    # factor is the most text ever tokenized to reject a prompt)
    assert n / 6 < bound.at_least(english) <= n
    assert bound.at_least("#" * 8_000_000) == 100_000  # the longest '#' token is 80
    assert bound.at_least("7" * 1000) == 1000  # digits are split one by one


@pytest.mark.parametrize("change", ["whitespace_pre_tokenizer", "lowercase", "strip",
                                    "lstrip_added_token", "wordpiece", "no_byte_fallback"])
def test_pipelines_that_may_drop_input_get_no_bound(change):
    # each of these can turn a long input into few tokens: the prompt is then tokenized
    tok = mistral()
    if change == "whitespace_pre_tokenizer":
        tok.pre_tokenizer = pre_tokenizers.Whitespace()  # drops whitespace
    elif change == "lowercase":
        tok.normalizer = normalizers.Lowercase()
    elif change == "strip":
        tok.normalizer = normalizers.Strip()
    elif change == "lstrip_added_token":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    elif change == "wordpiece":
        tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    elif change == "no_byte_fallback":
        tok = Tokenizer(models.BPE({"<unk>": 0, "a": 1}, [], unk_token="<unk>",
                                   fuse_unk=True))  # a run of unknowns is one <unk>
    assert TokenBound.from_tokenizer(tok) is None


def test_whitespace_pre_tokenizer_really_drops_input():
    # why the check above matters: 10,000 spaces are no token at all
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert tok.encode(" " * 10_000 + "a").ids == [0]


def test_counting_stops_early_with_a_bound_that_is_still_a_lower_bound(starter):
    tok, bound = starter
    text = "hello world " * 300_000  # 3.6 MB: four chunks
    full = bound.at_least(text)
    early = bound.at_least(text, above=1000)
    assert 1000 < early < full <= len(tok.encode(text).ids)
    assert bound.at_least(text, above=full) == full  # never past: counted to the end
