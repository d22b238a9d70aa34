"""The quantized KV cache's pieces without a model: the flags' checks, the max batch they
imply, which of mlx-lm's cache classes are quantized, and the KV bytes a token costs."""

from __future__ import annotations

import pytest

from kit.engine.cache.kv import (describe, layer_kinds, quantized_cache, refuse_unquantizable,
                           resolve_max_batch)
from kit.errors import ConfigError, ModelError
from kit.models.memory import kv_bytes_per_token

STARTER_CONFIG = {"num_hidden_layers": 30, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "hidden_size": 576, "torch_dtype": "float32"}


def test_max_batch_defaults_to_one_with_kv_bits_and_an_explicit_batch_is_refused():
    assert resolve_max_batch(None, None) == 8
    assert resolve_max_batch(4, None) == 4
    assert resolve_max_batch(None, 8) == 1
    assert resolve_max_batch(1, 4) == 1
    with pytest.raises(ConfigError) as e:
        resolve_max_batch(4, 4)
    assert "--kv-bits 4" in e.value.message and "--max-batch 4" in e.value.message


def test_kv_tag_names_each_setting_apart():
    from kit.engine.cache.kv import kv_tag

    assert [kv_tag(None), kv_tag(8), kv_tag(4, 32)] == ["kv-full", "kv8-g64", "kv4-g32"]


def test_describe_shows_full_precision_as_none():
    assert describe(None) == {"bits": None, "group_size": None, "quantized_start": None}
    assert describe(4, 32) == {"bits": 4, "group_size": 32, "quantized_start": 0}


def test_only_plain_kv_layers_are_quantized_and_a_model_with_none_is_refused():
    from mlx_lm.models.cache import (ArraysCache, KVCache, QuantizedKVCache,
                                     RotatingKVCache)

    mixed = [KVCache(), RotatingKVCache(max_size=16), ArraysCache(2), KVCache()]
    assert layer_kinds(mixed) == (2, ["ArraysCache", "RotatingKVCache"])
    assert refuse_unquantizable("m", mixed, 8) == (2, 4)
    out = quantized_cache(mixed, 4, 32)
    assert [type(c).__name__ for c in out] == ["QuantizedKVCache", "RotatingKVCache",
                                               "ArraysCache", "QuantizedKVCache"]
    assert isinstance(out[0], QuantizedKVCache) and (out[0].bits, out[0].group_size) == (4, 32)
    with pytest.raises(ModelError) as e:  # e.g. a model of sliding-window layers only
        refuse_unquantizable("org/sliding", [RotatingKVCache(max_size=16)], 8)
    assert "--kv-bits 8" in e.value.message and "RotatingKVCache" in e.value.message
    assert "without --kv-bits" in e.value.hint


def test_kv_bytes_per_token_counts_packed_values_and_each_groups_scale_and_bias():
    # the starter: 30 layers x 3 KV heads x head_dim 64, f32
    assert kv_bytes_per_token(STARTER_CONFIG) == 2 * 30 * 3 * 64 * 4 == 46080
    # 8 bits: 64 bytes of values + (scale, bias) x 1 group x 4 bytes = 72 a head
    assert kv_bytes_per_token(STARTER_CONFIG, kv_bits=8) == 2 * 30 * 3 * 72 == 12960
    assert kv_bytes_per_token(STARTER_CONFIG, kv_bits=4) == 2 * 30 * 3 * 40 == 7200
    assert kv_bytes_per_token(STARTER_CONFIG, kv_bits=4, group_size=32) == 2 * 30 * 3 * 48
    # a float16 model with 128-value heads: 256 bytes a head, 136 at 8 bits, 72 at 4
    f16 = {"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 128,
           "torch_dtype": "bfloat16"}
    assert [kv_bytes_per_token(f16, b) // 2 for b in (None, 8, 4)] == [256, 136, 72]


def test_the_estimate_matches_what_mlx_allocates_for_a_quantized_cache():
    """What kv_bytes_per_token says against the nbytes of a real QuantizedKVCache filled
    with 256 tokens (mlx-lm allocates in steps of 256, so no slack here)."""
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache

    for bits in (8, 4):
        c = QuantizedKVCache(group_size=64, bits=bits)
        c.update_and_fetch(mx.zeros((1, 3, 256, 64)), mx.zeros((1, 3, 256, 64)))
        per_layer = kv_bytes_per_token(STARTER_CONFIG, kv_bits=bits) // 30
        assert c.nbytes == per_layer * 256


def test_launch_forwards_the_kv_flags_to_the_server_it_starts():
    from kit.config import EngineConfig

    def argv(**given):
        return EngineConfig.from_flags(given).to_argv("launch")

    assert argv() == []
    assert argv(kv_bits=8) == ["--kv-bits", "8"]
    assert argv(kv_bits=4, kv_group_size=32) == ["--kv-bits", "4", "--kv-group-size", "32"]
