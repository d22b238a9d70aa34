"""Helpers every test module shares: a throwaway environment, `python -m kit` runs, real
server processes, file-tree snapshots, spec edits and the e2e "the agent's request reached
our server" check.

Plain functions only (the fixtures live in tests/conftest.py, which re-exports the older
names from here). Nothing is mocked: `run_kit` and `start_server` run real processes.

The test lanes (see docs/testing.md): a test that calls :func:`start_server` must carry the
``model`` marker and one that calls :func:`require_binary` the ``agent`` marker; conftest
marks them from their fixtures and folder, and these two functions fail a test that slipped
through, so ``pytest -m "not model and not agent"`` can never load a model unnoticed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent

#: The test being run (set by conftest's ``pytest_runtest_protocol``), so that
#: :func:`start_server` and :func:`require_binary` can check its markers; and how many
#: servers this session started (conftest prints it in the summary).
SESSION: dict[str, Any] = {"item": None, "server_starts": 0, "world_starts": 0,
                           "start_log": []}


# --- environment -------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path, hf_home: Path | None = None, **extra: str) -> dict[str, str]:
    """An environment with a throwaway HOME (XDG dirs derived from it) and no kit settings:
    every ``XDG_*``, ``MLX_KIT_*``, ``PI_*`` and ``HF_*`` variable dropped (but
    ``MLX_KIT_BLAS``: which BLAS mlx gets is the machine's, like ``OPENBLAS_CORETYPE``, so
    the suite can run as on a machine without OpenBLAS), ``PI_OFFLINE=1``,
    ``HF_HOME=hf_home`` if given, then ``extra`` on top."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "MLX_KIT_", "PI_", "HF_")) or k == "MLX_KIT_BLAS"}
    env.update(HOME=str(home), PI_OFFLINE="1", PYTHONUNBUFFERED="1")
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    env.update(extra)
    return env


def agentless_path() -> str:
    """``PATH`` without the folders that hold an agent binary (any spec's ``binary``), for
    tests of ``harness status`` that are not about agents: with the real agents on PATH
    (as in CI) each status runs every agent's ``--version`` (Node start-ups, ~8 s a
    status on 2 cores), which a model-free test must not pay."""
    from kit.harness.spec_loader import all_specs

    names = {s.binary for s in all_specs().values() if s.binary}
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not any(os.path.exists(os.path.join(d, n)) for n in names))


def _marked(name: str) -> bool:
    item = SESSION["item"]
    return item is None or item.get_closest_marker(name) is not None


def require_binary(name: str) -> str:
    """The path of an agent binary; skip without it, unless MLX_KIT_REQUIRE_AGENTS=1 (CI).

    Fails a test not marked ``agent`` (mark it, or put it under tests/e2e/): the marker is
    what keeps it out of the model-free lane."""
    if not _marked("agent"):
        pytest.fail(f"{SESSION['item'].nodeid} needs the {name!r} binary but is not marked "
                    "`agent`: add @pytest.mark.agent (tests/e2e/ is marked by its folder)")
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MLX_KIT_REQUIRE_AGENTS") == "1":
            pytest.fail(f"{name} is not on PATH but MLX_KIT_REQUIRE_AGENTS=1")
        pytest.skip(f"{name} is not installed")
    return path


def needs_proc(what: str) -> None:
    """Skip the running test where there is no Linux ``/proc`` (macOS): it reads ``what``
    of a process from there."""
    if not Path("/proc/self/status").exists():
        pytest.skip(f"reads {what} from /proc (Linux only)")


def table_rows(stdout: str) -> dict[str, list[str]]:
    """A plain table the CLI prints (kit.cli.output.print_table: a header line, then
    aligned rows whose cells never wrap) as its rows by first cell, each a list of cells:
    a column starts where its header does (after a gap of two spaces or more). Lines
    after the first blank one (notes under the table) are not rows."""
    lines = stdout.split("\n\n")[0].splitlines()
    if not lines:
        return {}
    starts = sorted({0} | {m.start() for m in re.finditer(r"(?<=  )\S", lines[0])})
    bounds = list(zip(starts, starts[1:] + [None]))
    cells = ([line[a:b].strip() for a, b in bounds] for line in lines[1:])
    return {row[0]: row for row in cells if any(row)}


def flat(text: str) -> str:
    """Text with its whitespace runs collapsed (rich wraps long lines at 80 columns)."""
    return " ".join(text.split())


# --- `python -m kit` -----------------------------------------------------------------------

def run_kit(env: dict[str, str] | Path, *args: str, cwd: Path | None = None,
            timeout: float = 120, input: str | None = None, stdin: int | None = None,
            hf_home: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
    """Run ``python -m kit ARGS`` (the code under test: PYTHONPATH is inherited) and return
    its result, stdout/stderr as text.

    ``env``: the environment, or a throwaway HOME folder, for which
    ``clean_env(HOME, hf_home)`` is used and ``cwd`` defaults to it; ``extra`` variables
    go on top of either.
    ``timeout`` in seconds (``TimeoutExpired`` past it); ``input`` is written to stdin,
    else ``stdin`` (e.g. ``subprocess.DEVNULL``; None: inherited) is passed on."""
    if isinstance(env, Path):
        cwd = env if cwd is None else cwd
        env = clean_env(env, hf_home)
    env = {**env, **extra}
    io: dict[str, Any] = {"input": input} if input is not None else {"stdin": stdin}
    return subprocess.run([sys.executable, "-m", "kit", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, **io)


# --- servers -----------------------------------------------------------------------------

def wait_until(condition: Callable[[], Any], timeout: float = 60, every: float = 0.05,
               what: str = "the condition") -> Any:
    """Poll ``condition`` until it returns something truthy (returned); exceptions count as
    not yet. Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds. For waits on
    observable state (a log line, a /health field) instead of ``sleep``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception:  # e.g. the server not listening yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen in {timeout} s")
        time.sleep(every)


def wait_health(root: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> dict:
    """The first 200 body of ``root``/health; ``RuntimeError`` if ``proc`` exits first,
    ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            r = httpx.get(root + "/health", timeout=1)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # ~75 starts a run: each waits for its next poll
    raise TimeoutError(f"{root} not ready after {timeout} s")


class Server:
    """A running `mlx-kit serve` process: ``proc``, ``port``, ``log`` (its file), ``home``
    (its HOME), ``root`` (``http://127.0.0.1:PORT``) and ``v1`` (root + ``/v1``)."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path, home: Path):
        self.proc, self.port, self.log, self.home = proc, port, log, home
        self.root = f"http://127.0.0.1:{port}"
        self.v1 = self.root + "/v1"

    def health(self) -> dict:
        return httpx.get(self.root + "/health", timeout=5).json()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def admin_token(self) -> str:
        pid_file = self.home / ".local" / "state" / "mlx-kit" / f"server-{self.port}.json"
        return json.loads(pid_file.read_text())["admin_token"]

    def swap(self, model: str, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.root + "/admin/swap", json={"model": model}, timeout=timeout,
                          headers={"Authorization": f"Bearer {self.admin_token()}"})


def spawn_server(home: Path, hf_home: Path | None, *args: str, port: int | None = None,
                 log_level: str | None = "debug", new_session: bool = False,
                 **env: str) -> Server:
    """Start ``python -m kit serve --port PORT --log-file HOME/serve-PORT.log ARGS`` with
    :func:`clean_env` (``env`` on top) and return at once, not waiting for /health.
    ``new_session``: in a session (and process group) of its own, as ``timeout``,
    systemd and a terminal's job control run it, so a test can signal the whole group.

    Fails a test not marked ``model`` (a server loads a model)."""
    if not _marked("model"):
        pytest.fail(f"{SESSION['item'].nodeid} starts a server but is not marked `model`: "
                    "take the hf_home fixture (or add @pytest.mark.model)")
    SESSION["server_starts"] += 1
    SESSION["world_starts"] += any(a in ("--ranks", "--hosts", "--hostfile") for a in args)
    item = SESSION["item"]
    SESSION["start_log"].append({"test": item.nodeid if item else "?", "args": list(args),
                                 "env": sorted(env), "ready_s": None})
    port = port or free_port()
    log = home / f"serve-{port}.log"
    extra = {"MLX_KIT_LOG_LEVEL": log_level} if log_level else {}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--log-file", str(log), *args],
                                env=clean_env(home, hf_home, **{**extra, **env}), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=new_session)
    return Server(proc, port, log, home)


def start_server(home: Path, hf_home: Path, *args: str, port: int | None = None,
                 new_session: bool = False, **env: str) -> Server:
    """:func:`spawn_server` (debug log), then wait until its /health is 200."""
    began = time.monotonic()
    server = spawn_server(home, hf_home, *args, port=port, new_session=new_session, **env)
    wait_health(server.root, server.proc)
    SESSION["start_log"][-1]["ready_s"] = round(time.monotonic() - began, 1)
    return server


def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL after 20 s (only the process this test started)."""
    server.proc.terminate()
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()


#: The API key of the session's keyed servers (:meth:`ServerPool.keyed`): one key, so one
#: keyed server serves every protocol's and agent's key tests.
TEST_KEY = "sekret-123"


class ServerPool:
    """Servers shared by the whole test session, one per configuration: :meth:`get` with
    the same arguments and environment returns the same running server, started on first
    use (in a throwaway HOME of its own) and stopped when the session ends.

    Each start costs ~5-8 s here (a 3-rank world 15-30 s), so a configuration that several
    modules need is started once. Only for tests that leave the server as they found it:
    no swap left in place, no alias or key changed, no engine killed; a test that counts
    requests reads ``requests_served`` before and after instead of assuming zero, and one
    that checks a cache miss sends a prompt no other test sends.

    At most ``limit`` servers stay up besides the pinned ones (the least recently used is
    stopped first), which bounds memory: each holds the starter's weights (~0.5 GiB). A
    session fixture that hands one server to many modules pins it (``pin=True``).
    """

    def __init__(self, root: Path, hf_home: Path, limit: int = 6):
        self.root, self.hf_home, self.limit = root, hf_home, limit
        self._servers: dict[tuple, Server] = {}
        self._pinned: set[tuple] = set()

    def get(self, *args: str, pin: bool = False, **env: str) -> Server:
        """The running server for ``serve ARGS`` with ``env`` on top of :func:`clean_env`;
        started (and /health waited for) if none runs for them. ``pin``: never stopped
        before the session ends."""
        key = (args, tuple(sorted(env.items())))
        if pin:
            self._pinned.add(key)
        server = self._servers.pop(key, None)
        if server is None or server.proc.poll() is not None:
            unpinned = [k for k in self._servers if k not in self._pinned]
            while len(unpinned) >= self.limit:
                stop(self._servers.pop(unpinned.pop(0)))
            home = self.root / f"pool-{SESSION['server_starts']}"
            home.mkdir(parents=True)
            server = start_server(home, self.hf_home, *args, **env)
        self._servers[key] = server  # last: the most recently used
        return server

    def keyed(self) -> Server:
        """The session's greedy server that needs :data:`TEST_KEY` (given in the
        environment, as the docs show first; ``--api-key`` on argv is tested on its own).
        Greedy whatever a request sets (``--force-sampling``): Droid sends temperature 1,
        and the 135M starter sampled at 1 under Droid's prompt rambled to the output cap,
        at 9 tok/s on a busy machine past Droid's 180 s request timeout, and Droid asked
        again until the test's 600 s ran out (2026-12-06)."""
        return self.get("--temperature", "0", "--force-sampling", pin=True,
                        MLX_KIT_API_KEY=TEST_KEY)

    def close(self) -> None:
        """Stop every server of the pool."""
        while self._servers:
            stop(self._servers.popitem()[1])


def openai_for(server: Server, timeout: float = 120) -> Any:
    """An official OpenAI client on ``server``'s /v1 (no retries: a failure is the answer)."""
    import openai

    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=timeout)


def anthropic_for(server: Server, timeout: float = 120) -> Any:
    """An official Anthropic client on ``server`` (Claude Code's setting: the root, no /v1)."""
    import anthropic

    return anthropic.Anthropic(base_url=server.root, api_key="unused", max_retries=0,
                               timeout=timeout)


def generated_texts(log: str) -> list[str]:
    """The texts a server logged at debug level (``<id>: text '<repr>'``), oldest first."""
    return [ast.literal_eval(m) for m in re.findall(r": text ('.*'|\".*\")$", log, re.M)]


def requests_served(server: Any) -> int:
    """``requests_served`` from ``server``'s /health (anything with a ``health()``)."""
    return server.health()["requests_served"]


def refusals(server: Server) -> int:
    """How many requests ``server`` answered 401 (its access log's lines): an agent run
    against the keyed server must add none, or one of its requests went without the key."""
    return len(re.findall(r'" 401', server.log_text()))


def assert_served(server: Any, before: int, answer: str | None = None, *, more: int = 1,
                  at_least: bool = False) -> None:
    """The e2e check that an agent's answer came from our server: /health counts ``more``
    requests than ``before`` (``at_least``: ``more`` or more), and ``answer`` (stripped),
    if given, is one of the texts the server generated (its debug log).

    ``server``: anything with ``health()`` and ``log_text()`` (a :class:`Server`)."""
    now = requests_served(server)
    if at_least:
        assert now >= before + more, f"served {now - before} requests, expected >= {more}"
    else:
        assert now == before + more, f"served {now - before} requests, expected {more}"
    if answer is not None:
        texts = [t.strip() for t in generated_texts(server.log_text())]
        assert answer.strip() in texts, f"{answer!r} is none of the generated texts {texts}"


def starter_with_template(hf_home: Path, folder: Path, template: Path, *,
                          tool_parser: str | None = None,
                          rename_tokens: dict[str, str] | None = None) -> Path:
    """A model folder with the starter's weights (linked, not copied) and another chat
    template: real weights behind a template with tool calls or thinking, which no model
    available offline has. ``tool_parser`` names mlx-lm's parser for the template;
    ``rename_tokens`` renames unused special tokens (e.g. to ``<think>``), so the
    vocabulary keeps its size."""
    from huggingface_hub import snapshot_download

    from kit.models.starter import STARTER_ID

    src = Path(snapshot_download(STARTER_ID, cache_dir=hf_home / "hub", local_files_only=True))
    folder.mkdir(parents=True)
    rename = rename_tokens or {}
    for f in src.iterdir():
        if f.name.startswith(".") or f.name == "tokenizer_config.json" or (
                rename and f.name == "tokenizer.json"):
            continue
        (folder / f.name).symlink_to(f.resolve())
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = template.read_text()
    if tool_parser:
        config["tool_parser_type"] = tool_parser
    if rename:
        config["additional_special_tokens"] = [rename.get(t, t) for t in
                                               config.get("additional_special_tokens", [])]
        tok = json.loads((src / "tokenizer.json").read_text())
        for added in tok["added_tokens"]:
            added["content"] = rename.get(added["content"], added["content"])
        vocab = tok["model"]["vocab"]
        for old, new in rename.items():
            vocab[new] = vocab.pop(old)
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def tiny_world_model(hf_home: Path, folder: Path, *, seed: int = 0,
                     decisive: bool = False, layers: int = 2) -> Path:
    """A llama checkpoint with random float32 weights, the starter's tokenizer and chat
    template, and shapes that split over 3 ranks (3 query and 3 KV heads of 32, hidden
    96, ``layers`` layers; 19 MB, mostly the embedding, or 38 MB with the decisive model's
    own output layer). Written with numpy and safetensors (no mlx in the test process);
    ``seed`` picks the weights.

    - ``decisive=False``: small weights (std 0.02, tied embedding), for tests of a world's
      processes (a killed or hung rank, stop, signals, the ring's guard), where the text
      is not what is tested and the starter's 538 MB on every rank only costs load time.
    - ``decisive=True``: for tests that compare two computations' greedy text (3 ranks vs
      one process, batched vs alone, a cache hit vs a cold prefill) at ~100x the starter's
      speed on a world. Weights at the usual 1/sqrt(fan_in) scale, so attention and the
      context decide each token; an untied output layer (a tied one would make each token
      its own likeliest successor); its rows for every token but plain words (``word``,
      `` word``) left at zero, so answers are readable words that never end early (no
      special token or stray byte can win), and a step's winner leads its runner-up by
      ~1 nat, far above the 1e-4 that f32 reorderings move (tests/greedy.py's TIE)."""
    import numpy as np
    from huggingface_hub import snapshot_download
    from safetensors.numpy import save_file

    from kit.models.starter import STARTER_ID

    src = Path(snapshot_download(STARTER_ID, cache_dir=hf_home / "hub", local_files_only=True))
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation")):
            shutil.copy(f.resolve(), folder / f.name)
    config = json.loads((src / "config.json").read_text())
    config.update(hidden_size=96, num_hidden_layers=layers, num_attention_heads=3,
                  num_key_value_heads=3, head_dim=32, intermediate_size=192)
    if decisive:
        config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    h, inter, heads, vocab = 96, 192, 3 * 32, config["vocab_size"]

    def w(out: int, fan_in: int, std: float | None = None) -> Any:
        scale = std if std is not None else (fan_in ** -0.5 if decisive else 0.02)
        return (rng.standard_normal((out, fan_in)) * scale).astype(np.float32)

    weights = {"model.embed_tokens.weight": w(vocab, h, 1.0 if decisive else 0.02),
               "model.norm.weight": np.ones(h, np.float32)}
    for i in range(layers):
        layer = f"model.layers.{i}."
        weights.update({
            layer + "self_attn.q_proj.weight": w(heads, h),
            layer + "self_attn.k_proj.weight": w(heads, h),
            layer + "self_attn.v_proj.weight": w(heads, h),
            layer + "self_attn.o_proj.weight": w(h, heads),
            layer + "mlp.gate_proj.weight": w(inter, h),
            layer + "mlp.up_proj.weight": w(inter, h),
            layer + "mlp.down_proj.weight": w(h, inter),
            layer + "input_layernorm.weight": np.ones(h, np.float32),
            layer + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    if decisive:
        words = re.compile(r"^\u0120?[A-Za-z]{2,}$")  # \u0120: byte-level BPE's space
        tok = json.loads((src / "tokenizer.json").read_text())
        special = {t["id"] for t in tok["added_tokens"]}
        head = w(vocab, h, 1.0)
        keep = np.zeros(vocab, bool)
        for piece, i in tok["model"]["vocab"].items():
            keep[i] = i not in special and bool(words.match(piece))
        head[~keep] = 0.0
        weights["lm_head.weight"] = head
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    return folder


# --- files -------------------------------------------------------------------------------

def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative, sorted) with its bytes (None for folders),
    leaving out any path with a part named in ``skip`` (e.g. ``("mlx-kit",)``: mlx-kit's
    own manifest and backups)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not set(skip) & set(p.relative_to(root).parts)}


def edited_spec(agent: str, edit: Callable[[str], str]) -> tuple[dict, str]:
    """The shipped ``harnesses/AGENT.toml``, its text passed through ``edit``, parsed as
    TOML: ``(data, "agent.toml")``, the arguments of ``kit.harness.spec.parse_spec``."""
    from kit.paths import harnesses_dir

    return tomllib.loads(edit((harnesses_dir() / f"{agent}.toml").read_text())), "agent.toml"
