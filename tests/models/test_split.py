"""How a model splits over mx.distributed ranks (kit/models/split.py), decided from
config.json, the safetensors headers and mlx-lm's source, never by importing mlx.

Model-free: small model folders written here with the safetensors library (real files in
the real format, tiny tensors); plus the real starter for its 3-rank-yes / 2-rank-no split.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from kit.errors import ConfigError, ModelError
from kit.models import mlx_lm_caps
from kit.models.memory import kv_bytes_per_token, weights_bytes
from kit.models.split import (MAX_RANKS, SplitError, parse_hosts, pipeline_ranges,
                              plan_split)

MLX_LM = Path(importlib.util.find_spec("mlx_lm").submodule_search_locations[0])


def llama_like(folder: Path, *, model_type: str = "llama", layers: int = 2, hidden: int = 24,
               heads: int = 6, kv_heads: int | None = 3, inter: int = 48, vocab: int = 40,
               index: bool = False, **extra) -> Path:
    """A llama-shaped model folder: config.json and one float32 model.safetensors holding
    each tensor a llama checkpoint has (embeddings, per-layer attention, MLP and norms,
    final norm, lm_head), with an o_proj bias to see that sharded-to-all biases stay
    whole. Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "hidden_size": hidden, "num_attention_heads": heads,
              "intermediate_size": inter, "num_hidden_layers": layers, "vocab_size": vocab,
              "max_position_embeddings": 1024, "torch_dtype": "float32", **extra}
    if kv_heads is not None:
        config["num_key_value_heads"] = kv_heads
    (folder / "config.json").write_text(json.dumps(config))
    head_dim = hidden // heads
    kv = (kv_heads or heads) * head_dim
    t = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
         "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": (hidden, hidden),
                  p + "self_attn.k_proj.weight": (kv, hidden),
                  p + "self_attn.v_proj.weight": (kv, hidden),
                  p + "self_attn.o_proj.weight": (hidden, hidden),
                  p + "self_attn.o_proj.bias": (hidden,),
                  p + "mlp.gate_proj.weight": (inter, hidden),
                  p + "mlp.up_proj.weight": (inter, hidden),
                  p + "mlp.down_proj.weight": (hidden, inter),
                  p + "input_layernorm.weight": (hidden,),
                  p + "post_attention_layernorm.weight": (hidden,)})
    arrays = {name: np.zeros(shape, np.float32) for name, shape in t.items()}
    save_file(arrays, str(folder / "model.safetensors"))
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {name: "model.safetensors" for name in t}}))
    return folder


def nbytes(*shapes: tuple[int, ...]) -> int:
    return sum(4 * int(np.prod(s)) for s in shapes)


# --- tensor parallel ----------------------------------------------------------------------

def test_one_rank_is_the_whole_model(tmp_path):
    folder = llama_like(tmp_path / "m")
    plan = plan_split(folder, 1, context=100)
    config = json.loads((folder / "config.json").read_text())
    assert plan.mode == "tensor" and plan.ranks == 1 and len(plan.per_rank) == 1
    share = plan.per_rank[0]
    assert share.weights_bytes == weights_bytes(folder)
    assert share.kv_bytes == kv_bytes_per_token(config) * 100
    assert share.layers == (0, 2) and share.total_bytes == share.weights_bytes + share.kv_bytes


def test_tensor_split_divides_the_projections_and_keeps_the_rest_whole(tmp_path):
    h, kv, inter, vocab = 24, 12, 48, 40
    folder = llama_like(tmp_path / "m", layers=2, hidden=h, heads=6, kv_heads=3, inter=inter,
                        vocab=vocab)
    plan = plan_split(folder, 3, context=64)
    whole = nbytes((vocab, h), (h,), (vocab, h)) + 2 * nbytes((h,), (h,), (h,))  # + o_proj bias
    sharded = 2 * nbytes((h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter))
    assert plan.mode == "tensor" and [s.rank for s in plan.per_rank] == [0, 1, 2]
    assert {s.weights_bytes for s in plan.per_rank} == {whole + sharded // 3}
    assert all(s.layers == (0, 2) for s in plan.per_rank)
    # KV heads are sharded: each rank caches a third of them
    assert plan.per_rank[0].kv_bytes == 2 * 2 * kv * 4 * 64 // 3
    assert sum(s.weights_bytes for s in plan.per_rank) >= weights_bytes(folder)


def test_kv_heads_not_divisible_names_the_field_its_value_and_the_counts_that_divide(tmp_path):
    folder = llama_like(tmp_path / "m", heads=6, kv_heads=3)
    with pytest.raises(SplitError) as e:
        plan_split(folder, 2)
    assert e.value.message == ("num_key_value_heads is 3, not divisible by 2 ranks; 3 ranks "
                               "divide it")
    assert e.value.hint == "rank counts that split this model: 3"
    assert isinstance(e.value, ModelError)


def test_kv_heads_default_to_the_attention_heads(tmp_path):
    folder = llama_like(tmp_path / "m", hidden=20, heads=5, kv_heads=None, inter=40)
    with pytest.raises(SplitError, match="num_attention_heads is 5, not divisible by 2"):
        plan_split(folder, 2)
    assert plan_split(folder, 5).ranks == 5


def test_intermediate_size_not_divisible_is_refused(tmp_path):
    folder = llama_like(tmp_path / "m", heads=6, kv_heads=6, inter=45)
    with pytest.raises(SplitError) as e:
        plan_split(folder, 2)
    assert e.value.message.startswith("intermediate_size is 45, not divisible by 2 ranks; "
                                      "3, 5, 9, 15, 45 ranks divide it")
    assert e.value.hint == "rank counts that split this model: 3"


def test_quantized_layers_need_whole_groups_per_rank(tmp_path):
    # 192 columns = 3 groups of 64: 2 ranks divide 192 but not the groups mlx cuts along
    # (small: the model-free lane's guard counts any weights file over 1 MB as a model)
    folder = llama_like(tmp_path / "m", hidden=128, heads=4, kv_heads=2, inter=192, layers=1,
                        quantization={"group_size": 64, "bits": 4})
    with pytest.raises(SplitError, match="intermediate_size / quantization group_size 64 is 3,"
                                         " not divisible by 2 ranks"):
        plan_split(folder, 2)


def test_moe_experts_width_is_checked_and_mla_kv_heads_are_not(tmp_path):
    folder = llama_like(tmp_path / "q", model_type="qwen3_moe", heads=6, kv_heads=6,
                        inter=48, moe_intermediate_size=9, num_experts=4)
    with pytest.raises(SplitError, match="moe_intermediate_size is 9, not divisible by 2"):
        plan_split(folder, 2)
    # deepseek_v3's shard() splits heads, not KV heads (MLA caches one latent per token)
    folder = llama_like(tmp_path / "d", model_type="deepseek_v3", heads=6, kv_heads=3,
                        inter=48, moe_intermediate_size=8, n_routed_experts=4)
    plan = plan_split(folder, 2, context=10)
    config = json.loads((folder / "config.json").read_text())
    assert plan.per_rank[0].kv_bytes == kv_bytes_per_token(config) * 10


def test_a_model_type_without_shard_is_refused_by_name(tmp_path):
    folder = llama_like(tmp_path / "m", model_type="gemma", heads=6, kv_heads=6)
    with pytest.raises(SplitError) as e:
        plan_split(folder, 2)
    assert e.value.message == "mlx-lm has no tensor parallel mode for model type 'gemma'"
    assert e.value.hint == "serve it on one machine"


@pytest.mark.parametrize("ranks", [0, -1, MAX_RANKS + 1, True, 2.0])
def test_rank_counts_out_of_range_are_refused(tmp_path, ranks):
    folder = llama_like(tmp_path / "m")
    with pytest.raises(SplitError, match="ranks must be 1 to 64"):
        plan_split(folder, ranks)


@pytest.mark.parametrize("model_type", ["no_such_family", "../../etc/passwd", 7, None])
def test_an_unknown_model_type_is_a_split_error(tmp_path, model_type):
    folder = llama_like(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    with pytest.raises(SplitError, match="model.type"):
        plan_split(folder, 3)


def test_broken_files_are_split_errors_not_crashes(tmp_path):
    folder = llama_like(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(SplitError, match="safetensors header of model.safetensors"):
        plan_split(folder, 3)
    (folder / "model.safetensors").unlink()
    with pytest.raises(SplitError, match="no \\*.safetensors"):
        plan_split(folder, 3)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(SplitError, match="not a JSON object"):
        plan_split(folder, 3)


def test_without_mlx_lm_no_split_is_possible(tmp_path, monkeypatch):
    # mlx-lm is installed here; its absence can only be simulated: find_spec says "none"
    folder = llama_like(tmp_path / "m")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlx_lm" else real(name, *a))
    mlx_lm_caps._mlx_lm_root.cache_clear()
    try:
        with pytest.raises(SplitError) as e:
            plan_split(folder, 3)
        assert "mlx-lm is not installed" in e.value.message and "pip install" in e.value.hint
        assert plan_split(folder, 1).ranks == 1  # one rank needs no mlx-lm
    finally:
        mlx_lm_caps._mlx_lm_root.cache_clear()


def test_planning_imports_neither_mlx_nor_mlx_lm(tmp_path):
    folder = llama_like(tmp_path / "m", model_type="qwen2", index=True)
    code = ("import sys; from pathlib import Path; from kit.models.split import plan_split;"
            f"plan_split(Path({str(folder)!r}), 3); plan_split(Path({str(folder)!r}), 2, True);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- what mlx-lm can split, read from its source -------------------------------------------

@pytest.mark.parametrize("model_type, tensor, pipeline", [
    ("llama", True, False),          # llama: shard(), no pipeline (distributed.md)
    ("mistral", True, False),        # MODEL_REMAPPING: mistral -> llama
    ("qwen2", True, True),           # PipelineMixin on Qwen2Model
    ("qwen3_5_moe", True, True),     # Model subclasses qwen3_5.Model; `model` is a property
    ("solar_open", True, True),      # Model re-exported from glm4_moe
    ("gemma", False, False),
])
def test_capabilities_follow_mlx_lm_source(model_type, tensor, pipeline):
    assert mlx_lm_caps.capabilities({"model_type": model_type})[1:] == (tensor, pipeline)


def test_shard_detection_matches_the_imported_classes():
    """Every mlx-lm model module: `shard` found in the source <=> the class has it."""
    code = """
import importlib, pkgutil, mlx_lm.models as M
from kit.models import mlx_lm_caps as C
wrong = []
for m in pkgutil.iter_modules(M.__path__):
    try:
        mod = importlib.import_module("mlx_lm.models." + m.name)
    except BaseException:  # a family needing an optional package
        continue
    if hasattr(mod, "Model"):
        if hasattr(mod.Model, "shard") != C._has_method(C._find_class(m.name, "Model"), "shard"):
            wrong.append(m.name)
print(wrong)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


# --- pipeline -------------------------------------------------------------------------------

def _mlx_lm_pipeline_ranges(layers: int, ranks: int) -> list[tuple[int, int]]:
    """mlx-lm's own PipelineMixin.pipeline (models/pipeline.py imports nothing, so it is
    loaded by path without importing mlx_lm) on a stand-in group object."""
    spec = importlib.util.spec_from_file_location("_pipeline", MLX_LM / "models/pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Group:
        def __init__(self, rank):
            self._rank = rank

        def rank(self):
            return self._rank

        def size(self):
            return ranks

    out = []
    for r in range(ranks):
        m = mod.PipelineMixin.__new__(mod.PipelineMixin)
        m.layers = list(range(layers))
        m.pipeline(Group(r))
        out.append((m.start_idx, m.end_idx))
    return out


@pytest.mark.parametrize("layers, ranks", [(30, 2), (30, 4), (7, 3), (5, 5), (61, 8), (1, 1)])
def test_pipeline_ranges_are_mlx_lms(layers, ranks):
    ranges = pipeline_ranges(layers, ranks)
    assert ranges == _mlx_lm_pipeline_ranges(layers, ranks)
    assert ranges[0][1] == layers  # rank 0 runs the last layers


def test_pipeline_shares_hold_their_layers_plus_embeddings_norm_and_head(tmp_path):
    h, vocab = 24, 40
    folder = llama_like(tmp_path / "m", model_type="qwen2", layers=5, hidden=h, index=True,
                        vocab=vocab)
    plan = plan_split(folder, 2, pipeline=True, context=32)
    assert plan.mode == "pipeline"
    assert [s.layers for s in plan.per_rank] == [(2, 5), (0, 2)]
    shared = nbytes((vocab, h), (h,), (vocab, h))
    per_layer = (weights_bytes(folder) - shared) // 5
    assert [s.weights_bytes for s in plan.per_rank] == [shared + 3 * per_layer,
                                                        shared + 2 * per_layer]
    config = json.loads((folder / "config.json").read_text())
    kv_layer = kv_bytes_per_token(config) // 5 * 32
    assert [s.kv_bytes for s in plan.per_rank] == [3 * kv_layer, 2 * kv_layer]


def test_pipeline_needs_the_safetensors_index(tmp_path):
    folder = llama_like(tmp_path / "m", model_type="qwen2", layers=4)
    with pytest.raises(SplitError, match="model.safetensors.index.json") as e:
        plan_split(folder, 2, pipeline=True)
    assert e.value.hint == "drop --pipeline to split by tensor parallelism"


def test_pipeline_with_more_ranks_than_layers_is_refused(tmp_path):
    folder = llama_like(tmp_path / "m", model_type="qwen2", layers=3, index=True)
    with pytest.raises(SplitError, match="4 ranks but the model has 3 layers") as e:
        plan_split(folder, 4, pipeline=True)
    assert e.value.hint == "at most --ranks 3"


def test_pipeline_for_a_family_without_it_names_the_type_and_suggests_tensor(tmp_path):
    folder = llama_like(tmp_path / "m", index=True)
    with pytest.raises(SplitError) as e:
        plan_split(folder, 3, pipeline=True)
    assert e.value.message == "mlx-lm has no pipeline mode for model type 'llama'"
    assert e.value.hint == "split it by tensor parallelism (drop --pipeline)"


def test_bytes_on_host_counts_the_ranks_mlx_launch_puts_there(tmp_path):
    folder = llama_like(tmp_path / "m", model_type="qwen2", layers=6, index=True)
    plan = plan_split(folder, 4, pipeline=True, context=8)
    shares = [s.total_bytes for s in plan.per_rank]
    assert plan.bytes_on_host() == sum(shares)  # --ranks alone: all on this machine
    assert plan.bytes_on_host(0, 2) == shares[0] + shares[1]  # host 0: ranks 0, 1
    assert plan.largest.total_bytes == max(shares)


# --- --hosts --------------------------------------------------------------------------------

def test_parse_hosts():
    assert parse_hosts("mac1,mac2.local,10.0.0.3,user@m4") == ["mac1", "mac2.local",
                                                               "10.0.0.3", "user@m4"]
    for bad in ("", "a,,b", "a b", "a;rm -rf", "-x", ",".join(["h"] * 65)):
        with pytest.raises(ConfigError):
            parse_hosts(bad)


# --- the real starter -------------------------------------------------------------------------

def _starter_folder(hf_home: Path, name: str = "SmolLM2-135M-Instruct") -> Path:
    (folder,) = (hf_home / "hub" / f"models--mlx-kit--{name}" / "snapshots").iterdir()
    return folder


def test_starter_splits_over_3_ranks_not_2(hf_home):
    folder = _starter_folder(hf_home)
    whole = plan_split(folder, 1).per_rank[0]
    three = plan_split(folder, 3)
    assert three.mode == "tensor" and len(three.per_rank) == 3
    assert sum(s.weights_bytes for s in three.per_rank) >= whole.weights_bytes
    assert three.per_rank[0].weights_bytes < whole.weights_bytes
    assert sum(s.kv_bytes for s in three.per_rank) == whole.kv_bytes  # 3 KV heads, 1 each
    with pytest.raises(SplitError, match="not divisible by 2 ranks") as e:
        plan_split(folder, 2)
    assert e.value.hint == "rank counts that split this model: 3"
    q4 = plan_split(_starter_folder(hf_home, "SmolLM2-135M-Instruct-4bit"), 3)
    assert q4.per_rank[0].weights_bytes < three.per_rank[0].weights_bytes


def test_config_sizes_that_are_not_numbers_are_split_errors(tmp_path):
    folder = llama_like(tmp_path / "m", quantization={"group_size": 64, "bits": 4})
    config = json.loads((folder / "config.json").read_text())
    for bad in ({"head_dim": "64"}, {"hidden_size": None}, {"num_hidden_layers": "2"},
                {"num_key_value_heads": "3"}, {"quantization": "4bit"}):
        (folder / "config.json").write_text(json.dumps({**config, **bad}))
        try:
            plan_split(folder, 3)
        except SplitError:
            pass  # refused with a message; anything else (TypeError...) fails the test
