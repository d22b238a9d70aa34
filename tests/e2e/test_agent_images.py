"""End to end: agents send an image to a vision model through `mlx-kit launch`, headless.

pi attaches an image given as ``@file`` in print mode (``pi -p @shot.png "..."``) when the
model's config declares image input: mlx-kit's generated extension gives a model
``input: ["text", "image"]`` exactly when /v1/models says ``capabilities.vision`` (the
newest pi and the oldest verified one, MLX_KIT_PI_OLDEST_BIN, as tests/e2e/test_pi.py);
Codex attaches ``exec -i FILE`` when mlx-kit's model catalog lists ``input_modalities``
with ``image``. The model is the tiny random-weight Qwen2.5-VL of bench/random_vlm.py, so
the check is the one a user makes in the server log: the request carried one image, and
its prompt is longer by the image's tokens than the same words without it."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.e2e.test_pi import pi_path
from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import clean_env, free_port, require_binary, run_kit
from tests.server.test_adapters_model import starter_folder
from tests.server.test_vision_model import IMAGE_TOKENS_512, png

pytestmark = [pytest.mark.model, pytest.mark.agent]

LINE = re.compile(r"prompt (\d+) tokens \(\d+ cached\)(, (\d+) images?)?, generated")


@pytest.fixture(scope="module")
def vlm(hf_home, tmp_path_factory):
    """The random VLM made to end every answer at once: its final norm zeroed (every logit
    0, so greedy picks token 0, ``<|endoftext|>``) and that token an end token. Its noise
    never ends by itself, and pi fails a print-mode answer cut by the output cap (8,192
    tokens here, ~2 minutes of noise)."""
    import mlx.core as mx

    from bench.random_vlm import build

    folder = build(tmp_path_factory.mktemp("vlm-pi") / "tiny-qwen2.5-vl", seed=0,
                   tokenizer=starter_folder(hf_home))
    weights = mx.load(str(folder / "model.safetensors"))
    norm = "language_model.model.norm.weight"
    weights[norm] = mx.zeros_like(weights[norm])
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, 0]}))
    return folder


def with_and_without(agent: str, vlm, hf_home, home, cwd, runs, **env_extra) -> tuple:
    """Launch ``agent`` on the vision model twice, its arguments ``runs[0]`` (attaching the
    image) then ``runs[1]`` (the same words without it); each must succeed without a
    config warning. Returns each run's request log lines ``(prompt tokens, _, images)``
    (the server's, from its debug log); the server is stopped after."""
    port = free_port()
    env = clean_env(home, hf_home, MLX_KIT_URL=f"http://127.0.0.1:{port}",
                    MLX_KIT_TEMPERATURE="0", MLX_KIT_LOG_LEVEL="debug", **env_extra)
    log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"
    seen = []
    try:
        for args in runs:
            start = len(log.read_text(errors="replace")) if log.exists() else 0
            r = run_kit(env, "launch", agent, "--model", str(vlm), "--", *args, cwd=cwd,
                        timeout=400, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
            assert_no_config_warnings(agent, r.stdout, r.stderr)
            seen.append(LINE.findall(log.read_text(errors="replace")[start:]))
    finally:
        run_kit(env, "stop", cwd=home, timeout=60)
    return tuple(seen)


def assert_one_image_sent(with_image: list, text_only: list) -> None:
    """Every request of the first run that carried an image carried one (an agent may send
    more than one request a run), none of the second did, and the largest prompt grew by
    at least the image's tokens and its two markers."""
    assert {images for _, _, images in with_image if images} == {"1"}
    assert not any(images for _, _, images in text_only)
    assert max(int(p) for p, _, _ in with_image) - max(int(p) for p, _, _ in text_only) \
        >= 2 + IMAGE_TOKENS_512


@pytest.mark.parametrize("which", ["newest", "oldest"])
def test_pi_sends_an_image_to_a_vision_model(which, vlm, hf_home, tmp_path):
    home = tmp_path / "home"
    (home / ".pi" / "agent").mkdir(parents=True)
    (home / ".pi" / "agent" / "settings.json").write_text(
        json.dumps({"retry": {"enabled": False}}))
    (home / "shot.png").write_bytes(png("teal"))
    question = ["-p", "What is in this picture?", "--no-session"]
    assert_one_image_sent(*with_and_without(
        "pi", vlm, hf_home, home, home, (["-p", "@shot.png", *question[1:]], question),
        PATH=pi_path(which)))


def test_codex_sends_an_image_to_a_vision_model(vlm, hf_home, tmp_path):
    """``codex exec -i shot.png``: Codex attaches the image only when its model catalog
    (mlx-kit's, from /v1/models) lists ``input_modalities`` with ``image``."""
    require_binary("codex")
    home = tmp_path / "home"
    home.mkdir()
    (home / "shot.png").write_bytes(png("teal"))
    # the prompt first: -i takes every file that follows it
    question = ["exec", "--skip-git-repo-check", "What is in this picture?"]
    assert_one_image_sent(*with_and_without(
        "codex", vlm, hf_home, home, home, ([*question, "-i", "shot.png"], question)))


def test_opencode_sends_an_image_to_a_vision_model(vlm, hf_home, tmp_path):
    """``opencode run -f shot.png``: opencode attaches the image only when its model config
    says ``modalities.input`` has ``image`` (mlx-kit's, from /v1/models)."""
    require_binary("opencode")
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    shot = home / "project" / "shot.png"
    shot.write_bytes(png("teal"))
    question = ["run", "What is in this picture?"]
    assert_one_image_sent(*with_and_without(
        "opencode", vlm, hf_home, home, home / "project",
        ([*question, "-f", str(shot)], question)))
