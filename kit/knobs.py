"""Every engine and server knob, declared once: :data:`KNOBS`.

Each :class:`Knob` names its flag, its ``MLX_KIT_*`` environment variable, its default, unit,
bounds and help. Two things are built from this one table:

- :class:`kit.config.EngineConfig`, the frozen pydantic-settings model that validates flags
  and the environment (flag > environment > default) and crosses into the engine whole;
- the typer options of ``serve``, ``launch`` and ``fit`` (:mod:`kit.cli.config_options`),
  each command taking the knobs whose :attr:`Knob.commands` name it.

The table is plain data (stdlib only) on purpose: every CLI start builds every command's
options, and importing pydantic there would cost ~0.3 s on ``mlx-kit status`` too; pydantic
is imported only once a command runs (:mod:`kit.config`).

Adding a knob: one entry here, then the code that uses ``config.<name>``.

This module is also the one reader of ``MLX_KIT_*`` variables (:func:`env`): the knobs'
(for :class:`~kit.config.EngineConfig`, :func:`environment`) and those one mlx-kit process
sets for another (:data:`VARIABLES`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any

ENV_PREFIX = "MLX_KIT_"


class WarmUp(str, Enum):
    """``--warmup``'s choices (see kit/engine/decode/warmup.py)."""

    auto = "auto"
    on = "on"
    off = "off"


class CompileDecode(str, Enum):
    """``--compile-decode``'s choices (see kit/engine/decode/compiled.py)."""

    on = "on"
    off = "off"


class LogLevel(str, Enum):
    """``--log-level``'s choices (Python logging's names)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


SERVE, LAUNCH, FIT = "serve", "launch", "fit"


@dataclass(frozen=True)
class Knob:
    """One setting.

    Attributes:
        name: the field of :class:`kit.config.EngineConfig` (``prompt_cache_disk``).
        kind: ``int``, ``float``, ``str``, ``bool``, ``"size"`` (bytes, given as ``8GiB`` /
            ``8GB`` / a number; stored as an int), ``"list"`` (repeatable flag; the
            variable is comma-separated, and the flags add to its items), ``"secret"``
            (a str never put on a command line by :meth:`~kit.config.EngineConfig.to_argv`,
            never sent to the engine) or an Enum.
        default: the value when neither the flag nor the variable is given (a size in
            bytes); None: unset.
        help: the flag's help text.
        commands: the commands that take the flag.
        unit: what a number counts (``s``, ``bytes``, ``tokens``), for the docs.
        ge, le: bounds (inclusive), checked for the flag (click, exit 2) and the variable.
        short: a one-letter alias (``-m``).
        env: the variable's name (default ``MLX_KIT_`` + the name in capitals).
        hidden: a test knob: no ``--help`` line, not in docs/cli.md.
        negatable: the flag is ``--NAME/--no-NAME`` (a bool whose default None means auto).
        path: a file or folder: made absolute (``~`` expanded) when validated, so a server
            started elsewhere (``launch``) finds it.
        shown_default: the default as ``--help`` shows it (``10GiB``).
    """

    name: str
    kind: Any
    default: Any
    help: str
    commands: tuple[str, ...] = (SERVE,)
    unit: str | None = None
    ge: float | None = None
    le: float | None = None
    short: str | None = None
    env: str | None = None
    hidden: bool = False
    negatable: bool = False
    path: bool = False
    shown_default: str | None = None

    @property
    def flag(self) -> str:
        """``--prompt-cache-disk``."""
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        """``MLX_KIT_PROMPT_CACHE_DISK``."""
        return self.env or ENV_PREFIX + self.name.upper()

    @property
    def secret(self) -> bool:
        return self.kind == "secret"


_WORLD = (SERVE, LAUNCH, FIT)
_STARTS = (SERVE, LAUNCH)  # launch passes these to a server it starts (config.to_argv())

KNOBS: tuple[Knob, ...] = (
    Knob("model", str, None, "Hub repo id in the local cache, or a model folder (default: "
         "the embedded starter). launch: a running server swaps to it.", _STARTS, short="-m"),
    Knob("embed_model", str, None, "Also serve this embedding model (a folder or a hub id in "
         "the local cache) at /v1/embeddings as local-embed, in its own process; needs "
         "mlx-kit[embeddings].", _WORLD),
    Knob("host", str, "127.0.0.1", "Address to bind. Anything but loopback needs an API key "
         "(--api-key-file)."),
    Knob("port", int, 8090, "TCP port.", ge=1, le=65535),
    Knob("api_key_file", str, None, "Require the key in FILE (its first line; the file must "
         "be yours and 0600 or stricter).", path=True),
    Knob("api_key", "secret", None, "Require this key (Bearer or x-api-key) on /v1. Prefer "
         "--api-key-file or MLX_KIT_API_KEY: other local users can read a command line."),
    Knob("ttl", float, 0.0, "Unload the model after this many idle seconds; the next "
         "request reloads it (0: never).", unit="s", ge=0),
    Knob("memory_budget", "size", None, "Most memory a model may need, e.g. 8GiB (binary) or "
         "8GB (10^9 bytes) (default: what is available).", _WORLD, unit="bytes"),
    Knob("swap_on_request", bool, False, "A request naming another cached model swaps to it "
         "(default: 404)."),
    Knob("adapter", "list", (), "NAME=PATH: also serve the model with the LoRA adapter in "
         "folder PATH (what mlx_lm.lora writes) as local:NAME. Repeatable; one machine "
         "only (not with --ranks/--hosts).", _STARTS),
    Knob("draft_model", "list", (), "DRAFT or TARGET=DRAFT: speculative decoding with the "
         "small model DRAFT (same tokenizer) for the model served at start, or for TARGET "
         "whenever it is loaded. Repeatable. Used by a request decoding alone without a "
         "grammar.", _WORLD),
    Knob("num_draft_tokens", int, 3, "Tokens the draft model proposes per step.", _STARTS,
         ge=1, le=16, unit="tokens"),
    Knob("alias", "list", (), "PATTERN=TARGET: serve model names matching PATTERN with TARGET "
         "(local or a model id). Repeatable; claude-*, gpt-* -> local are built in."),
    Knob("max_batch", int, None, "Most requests decoded together (continuous batching); 1: "
         "one at a time. Default: 8; 1 with --kv-bits.", ge=1, unit="requests"),
    Knob("kv_bits", int, None, "Quantize the KV cache to 8 or 4 bits (about 1/2 or 1/4 of a "
         "16-bit cache's memory); requests then decode one at a time.", _WORLD, unit="bits"),
    Knob("kv_group_size", int, 64, "Values per scale and bias of the quantized KV cache: 32, "
         "64 or 128.", _WORLD, unit="values"),
    Knob("prompt_cache_size", int, 4, "Prompt caches (KV of earlier requests) kept.", ge=1),
    Knob("prompt_cache_bytes", "size", None, "Most memory the prompt caches hold together, "
         "e.g. 2GB; least recently used evicted first (default: a quarter of the memory "
         "ceiling left after the weights).", _STARTS, unit="bytes"),
    Knob("prompt_cache_dir", str, None, "Folder of the prompt cache's disk tier, one only you "
         "can write (refused otherwise; default: prompt-cache/ in mlx-kit's cache dir).",
         _STARTS, path=True),
    Knob("prompt_cache_disk", "size", 10 * 2**30, "Most disk the prompt cache keeps KV caches "
         "of long prompts in, e.g. 10GiB, so they survive restarts and swaps (0: none).",
         _STARTS, unit="bytes", shown_default="10GiB"),
    Knob("temperature", float, None, "Sampling temperature for requests that set none "
         "(default: the model's generation_config.json, else 0.7).", ge=0, le=2),
    Knob("top_p", float, None, "Nucleus sampling mass for requests that set none (default: "
         "the model's, else 1).", ge=0, le=1),
    Knob("force_sampling", bool, False, "Sample every request with the server's temperature "
         "and top_p (the flags, else the model's) and the model's top_k and min_p, whatever "
         "the request sets (llama-swap's strip_params): for agents that send their hosted "
         "model's temperature (Droid: 1) to a small local model.", _STARTS),
    Knob("allow_host", "list", (), "Also accept requests whose Host header is NAME "
         "(repeatable; comma-separated in MLX_KIT_HOSTS). Loopback names and the bound "
         "address are always accepted; .example.com: the domain and its subdomains; *: any.",
         env="MLX_KIT_HOSTS"),
    Knob("allow_origin", "list", (), "Let web pages of ORIGIN (scheme://host[:port]) call "
         "the API, with CORS (repeatable; comma-separated in MLX_KIT_ORIGINS; *: any page, "
         "unsafe). Other requests carrying an Origin are refused.", env="MLX_KIT_ORIGINS"),
    Knob("max_body_size", "size", 32 * 2**20, "Largest request body, e.g. 32MiB (413 above "
         "it; the default holds one 20 MiB image in base64).", unit="bytes",
         shown_default="32MiB"),
    # images (a vision model only; kit/server/content/media.py). The wire to the engine
    # bounds one image at 64 MiB and a request at 64 images (kit/engine/proc/wire_records.py).
    Knob("max_image_bytes", "size", 20 * 2**20, "Largest image in a request, e.g. 20MiB "
         "(decoded; 400 image_too_large above it).", unit="bytes", ge=1, le=64 * 2**20,
         shown_default="20MiB"),
    # Pillow refuses more than 2 x its MAX_IMAGE_PIXELS (178,956,970) itself
    Knob("max_image_pixels", int, 50_000_000, "Most pixels (width x height) of one image, "
         "read from its header before it is decoded (400 image_too_large above it).",
         unit="pixels", ge=1, le=178_956_970),
    Knob("max_image_tokens", int, 2048, "Most tokens one image may become on a vision model "
         "whose processor sizes images by pixels (Qwen2/2.5/3-VL): larger images are scaled "
         "down to fit (2048: ~1.6 megapixels). Fixed-size models (Gemma 3, SmolVLM...) keep "
         "their own size.", _STARTS, ge=16, le=65536, unit="tokens"),
    Knob("image_dir", "list", (), "Let requests name image files by path (file:// URLs, "
         "Gemini fileData) inside FOLDER, links resolved (repeatable; comma-separated in "
         "MLX_KIT_IMAGE_DIRS). Off by default: a request cannot make the server read a "
         "file.", _STARTS, env="MLX_KIT_IMAGE_DIRS"),
    Knob("max_images", int, 16, "Most images in one request (400 too_many_images above it).",
         unit="images", ge=1, le=64),
    Knob("docs", bool, None, "Serve /openapi.json and /docs (default: on for a loopback "
         "bind).", negatable=True),
    Knob("trust_remote_code", bool, False, "Let a model run Python code shipped in its folder "
         "when it loads (a tokenizer named by auto_map, e.g. Kimi's; an architecture named "
         "by model_file). Off by default: that code runs with your user's rights, so pass it "
         "only for models you trust.", _STARTS),
    Knob("ranks", int, None, "Spread the model over N ranks with mlx.distributed (alone: N "
         "ranks on this machine; with --hosts: the total).", _WORLD, ge=1),
    # MLX_KIT_HOSTS is --allow-host's (it was first)
    Knob("hosts", str, None, "HOST[,HOST...]: the machines of the ranks, this one first "
         "(ring: IP addresses).", _WORLD, env="MLX_KIT_RANK_HOSTS"),
    Knob("hostfile", str, None, "An mlx.launch host file (mlx.distributed_config writes one); "
         "one entry per rank.", _STARTS, path=True),
    Knob("backend", str, None, "ring (TCP, default), jaccl (Thunderbolt RDMA), mpi or nccl "
         "(CUDA).", _STARTS),
    Knob("pipeline", bool, False, "Pipeline parallelism (layers split over ranks) instead of "
         "tensor parallelism.", _WORLD),
    Knob("rank_timeout", float, 300.0, "Seconds a rank waits for the others before the "
         "server ends.", unit="s", ge=5),
    Knob("warmup", WarmUp, WarmUp.auto, "Run the shapes of a first request and the first "
         "batches before the server says ready, so mlx compiles their kernels then (kept per "
         "machine in the kernel cache). auto: only where mlx runs on CUDA; on; off (not even "
         "one tiny generation).", _STARTS),
    Knob("compile_decode", CompileDecode, CompileDecode.off, "Decode a request alone with "
         "a compiled step (mx.compile: traced once, replayed per token) on Llama and Qwen "
         "models: on; off (the default: it measured 0.71 of the eager step's tok/s on an "
         "H100 and 0.94 on CPU, docs/performance.md).", _STARTS),
    Knob("graceful_shutdown_s", int, 5, "Seconds a stop (Ctrl-C, SIGTERM, `mlx-kit stop`) "
         "gives open requests to finish before they are cut off.", unit="s", ge=0, le=3600),
    Knob("log_file", str, None, "Log to FILE (and the engine's output too) instead of "
         "stderr; rotated at 10 MiB, 3 backups kept (FILE.1 to FILE.3). `mlx-kit logs` reads "
         "it.", path=True),
    Knob("log_level", LogLevel, LogLevel.info, "debug also writes the whole text of every "
         "answer the model generates to the log (the log file, for a detached server), so "
         "what prompts and answers contained ends up on disk."),
    # hidden test knobs: tests shorten waits and bounds that a user has no reason to change.
    # idle_write_s: an agent's next turn comes ms after an answer and must not wait for a
    # write (GBs for a big model); a newer cache replaces the queued one meanwhile.
    Knob("idle_write_s", float, 5.0, "Seconds without a request before a queued prompt cache "
         "is written to disk.", unit="s", ge=0.5, hidden=True),
    Knob("log_max_bytes", int, 10 * 2**20, "Size at which the log file rotates.",
         unit="bytes", ge=512, hidden=True),
    # rank_reap_s: mlx.launch ends the other ranks when one exits; one that hangs (stopped,
    # stuck where SIGTERM does not reach) is ended by us after this long.
    Knob("rank_reap_s", float, 15.0, "Seconds after a rank's exit before the ranks still "
         "running are ended.", unit="s", ge=1, hidden=True),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knobs_of(command: str) -> tuple[Knob, ...]:
    """The knobs ``command`` (``serve``, ``launch``, ``fit``) takes, in table order."""
    return tuple(k for k in KNOBS if command in k.commands)


#: Variables that are not knobs (name -> what it carries): the CLI's, and those one mlx-kit
#: process sets for another. Knobs' variables are :attr:`Knob.env_var`.
VARIABLES: dict[str, str] = {
    "MLX_KIT_URL": "the server URL every command talks to (--url's default)",
    "MLX_KIT_BLAS": "the BLAS library preloaded before mlx: auto, off or a path",
    "MLX_KIT_SERVER_LOG": "serve --log-file's path, for its engine process",
    "MLX_KIT_CONTROL": "a rank's control folder (the server's socket and authkey)",
    "MLX_KIT_INSTALL": "1: launch installs a missing agent without asking (as --install)",
    "MLX_KIT_WORLD_KEY": "the world's secret (hex), for local ranks; removed once read",
    # the ranks' own copies of their knobs (set by the server for mlx.launch's ranks)
    "MLX_KIT_BACKEND": "a rank's backend (the backend knob)",
    "MLX_KIT_PIPELINE": "1 for a rank of a pipeline split (the pipeline knob)",
    "MLX_KIT_RANK_TIMEOUT": "a rank's wait for its peers, s (the rank_timeout knob)",
    "MLX_KIT_RANK_HOSTS": "the ranks' hosts, comma-separated (the hosts knob)",
}


def _declared(name: str) -> str:
    if name not in VARIABLES and all(k.env_var != name for k in KNOBS):
        raise KeyError(f"{name} is not an mlx-kit variable (kit/knobs.py declares them)")
    return name


def env(name: str, default: str | None = None) -> str | None:
    """The variable ``name`` (a knob's or one of :data:`VARIABLES`), else ``default``.

    Raises:
        KeyError: ``name`` is declared nowhere (a typo must not read as unset).
    """
    return os.environ.get(_declared(name), default)


def take_env(name: str) -> str:
    """The variable ``name`` ("" when unset), removed from this process's environment (a
    secret must not reach what this process starts)."""
    return os.environ.pop(_declared(name), "")


def environment() -> dict[str, str]:
    """Every knob's variable that is set: what :class:`kit.config.EngineConfig` reads."""
    return {k.env_var: os.environ[k.env_var] for k in KNOBS if k.env_var in os.environ}
