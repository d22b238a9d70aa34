"""How a model splits over the ranks of an ``mx.distributed`` world, decided before any
rank starts: which mode mlx-lm can split it in, whether the split divides what mlx-lm's
``shard()`` divides, and each rank's weights and KV cache.

Pure Python: config.json, the safetensors headers and mlx-lm's source text. Nothing here
imports mlx or mlx_lm (importing mlx_lm imports mlx), so the HTTP process and ``mlx-kit
fit`` can refuse a bad split in milliseconds.

    plan_split(folder, 3)                  tensor parallel: every rank holds every layer,
                                           1/3 of each sharded projection
    plan_split(folder, 4, pipeline=True)   pipeline: each rank holds a range of layers
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from kit.errors import ConfigError
from kit.models.memory import _DTYPE_BYTES, kv_bytes_per_token
from kit.models.mlx_lm_caps import SplitError, capabilities
from kit.models.model_config import read_context_window

__all__ = ["MAX_RANKS", "RankShare", "SplitError", "SplitPlan", "parse_hosts",
           "pipeline_ranges", "plan_split"]

MAX_RANKS = 64
MAX_HOSTS = MAX_RANKS
#: a host as mlx.launch takes it in --hosts: a name, an IPv4/IPv6 address, maybe user@
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@%\[\]-]{0,252}")
#: a decoder layer's tensor, as mlx-lm's sharded_load matches them (utils.py)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: the tensors mlx-lm's shard() methods cut into N parts (attention projections, the
#: per-head MLA tensors, the sinks, the MLPs: dense, experts and shared experts); the
#: router (``mlp.gate.``), norms, embeddings and lm_head stay whole on every rank
_SHARDED = re.compile(r"\.(self_attn\.(q_proj|k_proj|v_proj|o_proj|q_b_proj|embed_q|"
                      r"unembed_out|sinks)|mlp\.(.*\.)?(gate_proj|up_proj|down_proj))(\.|$)")
#: "sharded-to-all" layers keep their bias whole (mlx.nn.layers.distributed)
_WHOLE_BIAS = re.compile(r"\.(o_proj|down_proj)\.bias$")


@dataclass(frozen=True)
class RankShare:
    """What one rank holds.

    Attributes:
        rank: 0 .. ranks-1 (rank 0 runs on this machine).
        weights_bytes: its weights, bytes (an estimate: the sharded tensors / N plus the
            whole of the others).
        kv_bytes: its KV cache for the plan's context, bytes.
        layers: the decoder layers it runs, ``(start, end)`` with ``end`` exclusive: a range
            in pipeline mode, ``(0, num_hidden_layers)`` in tensor mode.
    """

    rank: int
    weights_bytes: int
    kv_bytes: int
    layers: tuple[int, int]

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


@dataclass(frozen=True)
class SplitPlan:
    """How a model splits: ``mode`` ``"tensor"`` or ``"pipeline"``, ``ranks`` (the world
    size), ``per_rank`` (one :class:`RankShare` per rank, by rank) and ``context`` (the
    tokens each share's KV cache is sized for)."""

    mode: str
    ranks: int
    per_rank: list[RankShare]
    context: int

    @property
    def largest(self) -> RankShare:
        """The share that needs the most memory."""
        return max(self.per_rank, key=lambda s: s.total_bytes)

    def bytes_on_host(self, index: int = 0, hosts: int = 1) -> int:
        """Bytes the ranks on host ``index`` of ``hosts`` need together. mlx.launch repeats
        each host ``ranks / hosts`` times in order (``Hostfile.from_list``), so host 0 runs
        ranks 0 .. ranks/hosts - 1; with no hosts given every rank is on this machine."""
        per_host = self.ranks // hosts
        return sum(s.total_bytes for s in self.per_rank[index * per_host:(index + 1) * per_host])


def parse_hosts(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``: the hosts of ``--hosts``, as mlx.launch takes them.

    Raises:
        ConfigError: an empty name, a name with spaces or other characters no host name
            has, or more than :data:`MAX_HOSTS` hosts.
    """
    hosts = [h.strip() for h in text.split(",")]
    if len(hosts) > MAX_HOSTS:
        raise ConfigError(f"--hosts names {len(hosts)} hosts; at most {MAX_HOSTS}")
    for h in hosts:
        if not _HOST.fullmatch(h):
            shown = h if len(h) <= 40 else h[:40] + "..."
            raise ConfigError(f"--hosts: {shown!r} is not a host name or address",
                              hint="comma-separated, no spaces: --hosts mac1,mac2")
    return hosts


# --- the rules of each family's shard() ------------------------------------------------------

def _int(cfg: dict, name: str) -> int:
    """``cfg[name]`` when it is a positive int, else 0."""
    value = cfg.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _dense_layers(module: str, cfg: dict) -> bool:
    """Whether an MoE model also has dense MLP layers (whose ``intermediate_size`` shard()
    divides); dense families always do."""
    if module in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite"):
        return ((cfg.get("first_k_dense_replace") or 0) > 0
                or (cfg.get("moe_layer_freq") or 1) > 1 or cfg.get("n_routed_experts") is None)
    if module == "qwen3_moe":
        return (bool(cfg.get("mlp_only_layers")) or (cfg.get("decoder_sparse_step") or 1) > 1
                or not cfg.get("num_experts"))
    return True


def _divided_fields(module: str, cfg: dict) -> list[tuple[str, int]]:
    """``(config field, value)`` that ``shard()`` splits into N equal parts (it would
    raise, or silently compute wrong heads, otherwise), read from each family's shard():
    llama-like (llama, qwen2, qwen3, mistral, ...): heads, KV heads, the MLP width;
    qwen3_moe / glm4_moe: + the experts' width; deepseek_v2/v3 (MLA): heads and the MLP
    widths, no KV heads; gpt_oss: heads, KV heads and the experts' intermediate_size."""
    names = ["num_attention_heads"]
    if not module.startswith("deepseek"):
        names.append("num_key_value_heads")
    if _dense_layers(module, cfg):
        names.append("intermediate_size")
    names.append("moe_intermediate_size")
    values = [(n, _int(cfg, n) or (_int(cfg, "num_attention_heads")
                                    if n == "num_key_value_heads" and n not in cfg else 0))
              for n in names]
    return [(n, v) for n, v in values if v]


def _check_tensor(module: str, cfg: dict, quant: dict, ranks: int, pipeline_ok: bool) -> None:
    """Raise :class:`SplitError` naming the first field ``ranks`` does not divide."""
    fields = _divided_fields(module, cfg)
    group = quant.get("group_size") if isinstance(quant, dict) else None
    if isinstance(group, int) and group > 0:
        # a quantized sharded-to-all layer is cut along its scales: its input width must
        # hold a whole number of groups per rank
        heads, hidden = _int(cfg, "num_attention_heads"), _int(cfg, "hidden_size")
        head_dim = _int(cfg, "head_dim") or (hidden // heads if heads else 0)
        widths = [("num_attention_heads x head_dim", heads * head_dim)] + [
            (n, v) for n, v in fields if n.endswith("intermediate_size")]
        fields += [(f"{n} / quantization group_size {group}", w // group)
                   for n, w in widths if w and w % group == 0]

    def splits(n: int) -> bool:
        return all(v % n == 0 for _, v in fields)

    for name, value in fields:
        if value % ranks:
            divide = [n for n in range(2, MAX_RANKS + 1) if value % n == 0]
            whole = [n for n in range(2, MAX_RANKS + 1) if splits(n)]
            raise SplitError(
                f"{name} is {value}, not divisible by {ranks} ranks; "
                + (f"{_counts(divide)} ranks divide it" if divide else
                   "no rank count divides it"),
                hint=(f"rank counts that split this model: {_counts(whole)}" if whole else
                      "no rank count from 2 to 64 splits it by tensor parallelism")
                + ("; or --pipeline" if pipeline_ok else ""))


def _counts(ns: list[int]) -> str:
    shown = ", ".join(map(str, ns[:8]))
    return shown + (", ..." if len(ns) > 8 else "")


# --- the plan -------------------------------------------------------------------------------

def _tensors(folder: Path) -> dict[str, int]:
    """Tensor name -> bytes for every ``*.safetensors`` of ``folder``, from the headers
    (the safetensors library reads only the header and mmaps nothing it is not asked for)."""
    from safetensors import SafetensorError, safe_open

    sizes: dict[str, int] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SplitError(f"{folder.name} has no *.safetensors weights")
    for f in files:
        try:
            with safe_open(f, framework="numpy") as fh:
                for name in fh.keys():
                    t = fh.get_slice(name)
                    sizes[name] = math.prod(t.get_shape()) * _DTYPE_BYTES.get(t.get_dtype(), 4)
        except (SafetensorError, OSError) as e:
            raise SplitError(f"cannot read the safetensors header of {f.name}: {e}") from None
    return sizes


def pipeline_ranges(layers: int, ranks: int) -> list[tuple[int, int]]:
    """``(start, end)`` per rank, as mlx-lm's ``PipelineMixin.pipeline`` (models/pipeline.py)
    assigns them: an even split where the low ranks get the extra layers, laid out in
    reverse so rank 0 runs the LAST layers and rank ranks-1 the first."""
    base, extra = divmod(layers, ranks)
    split = [base + (1 if r < extra else 0) for r in range(ranks)]
    return [(sum(split[r + 1:]), sum(split[r + 1:]) + split[r]) for r in range(ranks)]


def plan_split(folder: Path, ranks: int, pipeline: bool = False,
               context: int | None = None) -> SplitPlan:
    """How the model in ``folder`` splits over ``ranks`` ranks.

    Args:
        folder: a model folder (config.json + ``*.safetensors``).
        ranks: the world size, 1 to :data:`MAX_RANKS`; 1 is the whole model on one rank.
        pipeline: split by layers (mlx-lm's pipeline mode) instead of tensor parallelism.
        context: tokens each rank's KV cache is sized for; None: the model's context window.

    Returns:
        a :class:`SplitPlan` with one share per rank, bytes estimated from the headers.

    Raises:
        SplitError: ranks out of range; mlx-lm missing or unable to split this model type
            in that mode; a dimension ``ranks`` does not divide (the message names the
            config field, its value and the rank counts that divide it); pipeline mode
            without ``model.safetensors.index.json`` or with more ranks than layers.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise SplitError(f"ranks must be 1 to {MAX_RANKS}, not {ranks!r}")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int)
                                or context < 0):
        raise SplitError(f"context must be a token count, not {context!r}")

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SplitError(f"cannot read {folder / 'config.json'}: {e}") from None
    if not isinstance(config, dict):
        raise SplitError(f"{folder / 'config.json'} is not a JSON object")
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    context = context if context is not None else read_context_window(folder)
    try:
        kv_per_token = kv_bytes_per_token(config)
        if not isinstance(kv_per_token, int) or kv_per_token < 0:  # e.g. "64" * 2: a str
            raise TypeError(kv_per_token)
    except (TypeError, ValueError, ZeroDivisionError):
        raise SplitError("config.json's attention sizes (num_hidden_layers, "
                         "num_key_value_heads, head_dim) are not numbers") from None
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise SplitError(f"config.json's num_hidden_layers is {str(layers)[:20]!r}, not a "
                         "layer count")
    tensors = _tensors(folder)
    whole = sum(tensors.values())
    if ranks == 1:
        return SplitPlan("tensor", 1, [RankShare(0, whole, kv_per_token * context,
                                                 (0, layers))], context)
    module, tensor_ok, pipeline_ok = capabilities(config)
    mtype = config.get("model_type")
    if pipeline:
        if not pipeline_ok:
            raise SplitError(f"mlx-lm has no pipeline mode for model type {mtype!r}",
                             hint="split it by tensor parallelism (drop --pipeline)"
                             if tensor_ok else "serve it on one machine")
        if not (folder / "model.safetensors.index.json").is_file():
            raise SplitError(f"pipeline mode needs {folder.name}/model.safetensors.index.json"
                             " (mlx-lm picks each rank's weight files from it)",
                             hint="drop --pipeline to split by tensor parallelism"
                             if tensor_ok else "re-save the model with mlx_lm.convert")
        if ranks > layers:
            raise SplitError(f"{ranks} ranks but the model has {layers} layers: every "
                             "pipeline rank needs at least one layer",
                             hint=f"at most --ranks {layers}" if layers else None)
        ranges = pipeline_ranges(layers, ranks)
        shared = sum(b for n, b in tensors.items() if not _LAYER.search(n))
        per = []
        for r, (start, end) in enumerate(ranges):
            own = sum(b for n, b in tensors.items()
                      if (m := _LAYER.search(n)) and start <= int(m.group(1)) < end)
            per.append(RankShare(r, shared + own, kv_per_token * (end - start) // layers
                                 * context, (start, end)))
        return SplitPlan("pipeline", ranks, per, context)
    if not tensor_ok:
        raise SplitError(f"mlx-lm has no tensor parallel mode for model type {mtype!r}",
                         hint="try --pipeline" if pipeline_ok else "serve it on one machine")
    _check_tensor(module, cfg, config.get("quantization") or {}, ranks, pipeline_ok)
    weights = sum(-(-b // ranks) if _SHARDED.search(n) and not _WHOLE_BIAS.search(n) else b
                  for n, b in tensors.items())
    # KV heads are sharded with the attention; MLA (deepseek) caches a latent every rank holds
    kv = kv_per_token * context // (1 if module.startswith("deepseek") else ranks)
    return SplitPlan("tensor", ranks, [RankShare(r, weights, kv, (0, layers))
                                       for r in range(ranks)], context)
