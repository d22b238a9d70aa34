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
import shutil
import subprocess

import pytest

from tests.e2e.test_pi import pi_path
from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import clean_env, free_port, run_kit
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


@pytest.mark.parametrize("which", ["newest", "oldest"])
def test_pi_sends_an_image_to_a_vision_model(which, vlm, hf_home, tmp_path):
    home, port = tmp_path / "home", free_port()
    (home / ".pi" / "agent").mkdir(parents=True)
    (home / ".pi" / "agent" / "settings.json").write_text(
        json.dumps({"retry": {"enabled": False}}))
    (home / "shot.png").write_bytes(png("teal"))
    env = clean_env(home, hf_home, MLX_KIT_URL=f"http://127.0.0.1:{port}",
                    MLX_KIT_TEMPERATURE="0", MLX_KIT_LOG_LEVEL="debug", PATH=pi_path(which))
    log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"
    try:
        prompts = []
        for attach in (["@shot.png"], []):
            r = run_kit(env, "launch", "pi", "--model", str(vlm), "--", "-p", *attach,
                        "What is in this picture?", "--no-session", cwd=home, timeout=300)
            assert r.returncode == 0, r.stderr
            assert_no_config_warnings("pi", r.stdout, r.stderr)
            prompts.append(LINE.findall(log.read_text(errors="replace"))[-1])
        (with_image, _, images), (text_only, _, none) = prompts
        assert images == "1" and none == ""
        # the image's patches and its two markers; pi may add a line naming the file
        assert int(with_image) - int(text_only) >= 2 + IMAGE_TOKENS_512
    finally:
        run_kit(env, "stop", cwd=home, timeout=60)


def test_codex_sends_an_image_to_a_vision_model(vlm, hf_home, tmp_path):
    """``codex exec -i shot.png``: Codex attaches the image only when its model catalog
    (mlx-kit's, from /v1/models) lists ``input_modalities`` with ``image``."""
    from tests.helpers import require_binary

    require_binary("codex")
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "shot.png").write_bytes(png("teal"))
    env = clean_env(home, hf_home, MLX_KIT_URL=f"http://127.0.0.1:{port}",
                    MLX_KIT_TEMPERATURE="0", MLX_KIT_LOG_LEVEL="debug")
    log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"
    try:
        prompts = []
        for attach in (["-i", "shot.png"], []):
            # the prompt first: -i takes every file that follows it
            r = run_kit(env, "launch", "codex", "--model", str(vlm), "--", "exec",
                        "--skip-git-repo-check", "What is in this picture?", *attach,
                        cwd=home, timeout=300, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
            assert_no_config_warnings("codex", r.stdout, r.stderr)
            prompts.append(LINE.findall(log.read_text(errors="replace"))[-1])
        (with_image, _, images), (text_only, _, none) = prompts
        assert images == "1" and none == ""
        assert int(with_image) - int(text_only) >= 2 + IMAGE_TOKENS_512
    finally:
        run_kit(env, "stop", cwd=home, timeout=60)


def test_opencode_sends_an_image_to_a_vision_model(vlm, hf_home, tmp_path):
    """``opencode run -f shot.png``: opencode attaches the image only when its model config
    says ``modalities.input`` has ``image`` (mlx-kit's, from /v1/models); it also sends a
    title request, so each run's largest prompt is compared."""
    from tests.helpers import require_binary

    require_binary("opencode")
    home, port = tmp_path / "home", free_port()
    (home / "project").mkdir(parents=True)
    (home / "project" / "shot.png").write_bytes(png("teal"))
    env = clean_env(home, hf_home, MLX_KIT_URL=f"http://127.0.0.1:{port}",
                    MLX_KIT_TEMPERATURE="0", MLX_KIT_LOG_LEVEL="debug")
    log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"
    try:
        runs = []
        for attach in (["-f", str(home / "project" / "shot.png")], []):
            start = len(log.read_text(errors="replace")) if log.exists() else 0
            r = run_kit(env, "launch", "opencode", "--model", str(vlm), "--", "run",
                        "What is in this picture?", *attach, cwd=home / "project",
                        timeout=400, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
            assert_no_config_warnings("opencode", r.stdout, r.stderr)
            runs.append(LINE.findall(log.read_text(errors="replace")[start:]))
        with_image, text_only = runs
        # every request of the run that carried it carried the one image (opencode may
        # send more than one request per run)
        assert {images for _, _, images in with_image if images} == {"1"}
        assert not any(images for _, _, images in text_only)
        assert max(int(p) for p, _, _ in with_image) - max(int(p) for p, _, _ in text_only) \
            >= 2 + IMAGE_TOKENS_512
    finally:
        run_kit(env, "stop", cwd=home, timeout=60)
