"""Vision models: loading through mlx-vlm, the image (and audio) prompt, and its decode.

A model whose config.json has a ``vision_config`` and whose ``model_type`` mlx-vlm knows
loads with ``mlx_vlm.load`` (the model and its processor), and every request to it, with
images or not, decodes here with ``mlx_vlm.stream_generate`` alone: mlx-vlm's language
models take the image features and their position ids (Qwen's mRoPE) where mlx-lm's
``BatchGenerator`` cannot, so a vision model serves one request at a time (``/health``
``max_batch`` says so). What the text path does around the tokens stays the same
(:class:`kit.engine.decode.pipeline.Pipeline`: sampling checks, constraints, admission,
the output parser, ``Started``/``Finished``).

The prompt: the messages go through the chat template as the multimodal form
(``{"type": "image"}`` parts, :class:`kit.engine.types.ChatRequest`), then through the
model's processor (``mlx_vlm.prepare_inputs``), which repeats the image token once per
image patch the vision tower makes: a prompt's token count includes its image tokens, and
admission and the context check count them.

The prompt cache: mlx-vlm's ``PromptCacheState`` (the KV of a conversation's last turn,
reused for the longest common token prefix when what follows it has no image tokens),
one per set of images: :class:`VisionCaches` keys each by the SHA-256 of the request's
images (and audio clips) in order, so two turns with the same image pixels reuse the KV
and a turn with another image never does (image tokens are alike whatever the image, so
the token ids alone cannot tell). Memory tier only.

Audio: a vision model whose config has an audio tower (Gemma 4, Gemma 3n) takes
``{"type": "audio"}`` parts the same way, the processor repeating the audio token once per
audio frame (Gemma 4: one per 40 ms); verified here only with random weights
(bench/random_omni.py).

Checked against mlx-vlm 0.7.10.
"""

from __future__ import annotations

import io
import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from kit import mlx_lm_api
from kit.engine.types import AudioInput, ChatRequest, ImageInput, InvalidRequest
from kit.models.vision import is_audio_model, is_vision_model, mlx_vlm_installed

log = logging.getLogger("mlx_kit.engine")

#: PromptCacheStates kept (conversations with distinct images, or none); the least
#: recently used one goes first.
MAX_STATES = 4


def is_vision_folder(path: Path) -> bool:
    """Whether the model in ``path`` loads through mlx-vlm: the catalog's rule
    (:func:`kit.models.vision.is_vision_model`: a non-null ``vision_config`` and a
    ``model_type`` mlx-vlm has a model for). A vision config without mlx-vlm installed is
    logged, and the text path (mlx-lm) may still load its language model."""
    if is_vision_model(path):
        return True
    if not mlx_vlm_installed():
        try:
            config = json.loads((Path(path) / "config.json").read_text())
        except (OSError, ValueError):
            return False
        if isinstance(config, dict) and config.get("vision_config"):
            log.warning("%s is a vision model, but mlx-vlm is not installed: it is served "
                        "as text only (pip install 'mlx-kit[vision]' for image input)", path)
    return False


def load(path: str, trust_remote_code: bool,
         max_image_tokens: int | None = None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, processor)`` of the vision model in ``path``: mlx-vlm's model
    and processor (its images capped by :func:`cap_image_tokens`), and mlx-lm's
    ``TokenizerWrapper`` of the same folder's tokenizer (what the text path's prompt
    rendering, output parser and grammar read).

    Raises:
        Exception: whatever mlx-vlm raises for a folder it cannot load.
    """
    import mlx_vlm

    model, processor = mlx_vlm.load(path, trust_remote_code=trust_remote_code)
    if max_image_tokens is not None:
        cap_image_tokens(processor, max_image_tokens)
    eos = getattr(model.config, "eos_token_id", None)
    tokenizer = mlx_lm_api.load_tokenizer(Path(path), {"trust_remote_code": trust_remote_code},
                                          eos_token_ids=eos)
    template = getattr(processor, "chat_template", None)
    hf = mlx_lm_api.hf_tokenizer(tokenizer)
    if template and not getattr(hf, "chat_template", None):
        hf.chat_template = template  # the processor's (chat_template.jinja) is the model's
    return model, tokenizer, processor


def cap_image_tokens(processor: Any, max_tokens: int) -> None:
    """Make ``processor`` scale an image down to at most ``max_tokens`` image tokens, for
    processors that size images by pixel count (Qwen2/2.5/3-VL's ``max_pixels``: one
    token per ``(patch_size * merge_size)**2`` pixels). A 12-megapixel photo is ~15,000
    tokens there, whose vision-tower attention alone can exhaust memory. A processor of
    another kind is left as it is (fixed-size models such as Gemma 3 and SmolVLM bound
    their own image tokens)."""
    ip = getattr(processor, "image_processor", None)
    patch, merge = getattr(ip, "patch_size", None), getattr(ip, "merge_size", None)
    pixels = getattr(ip, "max_pixels", None)
    if not (isinstance(patch, int) and isinstance(merge, int) and isinstance(pixels, int)):
        return
    cap = max_tokens * (patch * merge) ** 2
    if pixels > cap:
        ip.max_pixels = cap
        size = getattr(ip, "size", None)
        if isinstance(size, dict) and "longest_edge" in size:
            size["longest_edge"] = cap
        log.info("images are scaled to at most %d tokens (%d pixels; "
                 "--max-image-tokens)", max_tokens, cap)


def media_parts(messages: list[dict[str, Any]], kind: str = "image") -> int:
    """How many ``{"type": kind}`` parts (``image`` or ``audio``) ``messages`` hold (list
    contents only)."""
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == kind)


def pil_images(images: tuple[ImageInput, ...]) -> list[Any]:
    """The images as RGB PIL images (the HTTP side has checked and decoded each once).

    Raises:
        InvalidRequest: an image cannot be decoded (field ``images.<i>``).
    """
    from PIL import Image, ImageOps

    out = []
    for i, image in enumerate(images):
        try:
            with Image.open(io.BytesIO(image.data)) as img:
                # upright as the camera meant it (EXIF Orientation), as mlx-vlm's own
                # load_image does: a phone's portrait photo is stored sideways
                out.append(ImageOps.exif_transpose(img).convert("RGB"))
        except Exception as e:  # noqa: BLE001 (any decoder error is the image's)
            raise InvalidRequest(f"image {i} cannot be decoded: {e}", code="invalid_image",
                                 field=f"images.{i}") from None
    return out


def inputs(slot: Any, request: ChatRequest, text: str) -> tuple[list[int], dict[str, Any]]:
    """The prompt's token ids (image and audio tokens repeated per patch and per audio
    frame) and the processor's arrays (``pixel_values``, ``mask``, and model-specific ones
    such as ``image_grid_thw`` or the audio's ``input_features``) for the rendered prompt
    ``text``, ``request.images`` and ``request.audio``.

    Audio goes to mlx-vlm as the WAV bytes: its ``load_audio`` decodes them, mixes them
    down to mono and resamples them to the feature extractor's rate (16 kHz for Gemma).

    Raises:
        InvalidRequest: the chat template wrote a different number of images or clips than
            the request carries (it dropped some), the model takes no audio, or an image
            cannot be decoded.
    """
    from mlx_vlm import prepare_inputs

    for kind, media in (("image", request.images), ("audio", request.audio)):
        wanted = media_parts(request.messages, kind)
        if wanted != len(media):
            raise InvalidRequest(f"the request has {len(media)} {kind} inputs for {wanted} "
                                 f"{kind} parts", field="messages")
        if not media:
            continue
        token = _media_token(slot, kind)
        written = text.count(token) if token else len(media)
        if written != len(media):
            raise InvalidRequest(
                f"the model's chat template wrote {written} of the request's {len(media)} "
                f"{kind} inputs into the prompt (it reads them only in some messages, e.g. "
                "not in system or tool messages)", field="messages")
    if request.audio and not takes_audio(slot):
        raise InvalidRequest("audio content is not supported by this model",
                             code="unsupported_content", field="messages")
    images = pil_images(request.images) if request.images else None
    audio = [io.BytesIO(clip.data) for clip in request.audio] or None
    config = getattr(slot.model, "config", None)  # None while unloaded (count_tokens)
    out = prepare_inputs(slot.processor, images=images, audio=audio, prompts=text,
                         image_token_index=getattr(config, "image_token_index", None),
                         add_special_tokens=False)
    ids = [int(t) for t in out["input_ids"][0].tolist()]
    extra = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    extra["mask"] = out.get("attention_mask")
    return ids, extra


def takes_audio(slot: Any) -> bool:
    """Whether the loaded vision model reads audio: its processor has an audio feature
    extractor and its folder's config an audio tower (:func:`kit.models.vision.is_audio_model`;
    Gemma 4's processor has the extractor even for checkpoints without the tower)."""
    return getattr(slot.processor, "feature_extractor", None) is not None and \
        is_audio_model(slot.info.path)


def _media_token(slot: Any, kind: str) -> str | None:
    """The text the chat template writes once per image (Qwen: ``<|image_pad|>``) or
    audio clip (Gemma 4: ``<|audio|>``), or None when the processor does not name it."""
    token = getattr(slot.processor, f"{kind}_token", None)
    return token if isinstance(token, str) and token else None


def media_token_ids(config: Any) -> set[int]:
    """The token ids that stand for media in a prompt of the model with ``config``:
    mlx-vlm's (images, video) and the audio token. mlx-vlm 0.7.10's prefix reuse knows no
    audio token: it would prefill a suffix holding a clip's tokens with the features of the
    conversation's first clip (tests/server/test_audio_model.py). (On a reuse it also runs
    the audio tower again for a text suffix; whether it reuses at all is its decision,
    e.g. not past a wrapped sliding window, so the features are always passed.)"""
    from mlx_vlm import apc

    ids = set(apc.multimodal_token_ids_from_config(config))
    audio = getattr(config, "audio_token_id", None)
    if isinstance(audio, int):
        ids.add(audio)
    return ids


def media_token_counts(ids: list[int], config: Any) -> tuple[int, int]:
    """``(image tokens, audio tokens)`` of the prompt ``ids`` of the model with ``config``:
    how many of its tokens are the audio token (``audio_token_id``) and how many the other
    media tokens of :func:`media_token_ids` (image and video placeholders); a clip's or an
    image's begin and end markers count as text."""
    audio = getattr(config, "audio_token_id", None)
    images = media_token_ids(config) - {audio}
    n_audio = sum(1 for t in ids if t == audio) if isinstance(audio, int) else 0
    return sum(1 for t in ids if t in images), n_audio


def _text_suffix(ids: list[int], n: int, media: set[int]) -> bool:
    """Whether ``ids[n:]`` (what is left to prefill after a reused prefix of ``n``) holds
    no media token (mlx-vlm's ``prefix_leaves_text_only_suffix``, with audio counted)."""
    from mlx_vlm import apc

    return apc.prefix_leaves_text_only_suffix(ids, n, media)


class VisionCaches:
    """mlx-vlm ``PromptCacheState``s keyed by the model (and adapter) and the SHA-256s of a
    request's images, least recently used out first past :data:`MAX_STATES`."""

    def __init__(self, size: int = MAX_STATES) -> None:
        self.size = size
        self._states: OrderedDict[tuple, Any] = OrderedDict()

    @staticmethod
    def key(model_key: str, images: tuple[ImageInput, ...],
            audio: tuple[AudioInput, ...] = ()) -> tuple:
        """``(model_key, image digests..., "audio", clip digests...)``: the media in order,
        told apart by kind (an image and a clip never share a key)."""
        return (model_key, *(i.digest for i in images), "audio", *(a.digest for a in audio))

    def state(self, key: tuple, ids: list[int] | None = None, config: Any = None) -> Any:
        """The state for ``key`` (a new, empty one if none), now the most recent.

        ``ids``: the prompt about to run. mlx-vlm reuses a cached prefix only when some of
        the prompt is left to prefill, so a prompt the state holds whole (a retry, a
        regenerate) would start cold: its record is cut to all but the prompt's last token
        (mlx-vlm then trims the KV past it and prefills that one token). A state whose
        reusable prefix would leave audio tokens to prefill is replaced by an empty one
        (see :func:`media_token_ids`)."""
        from mlx_vlm.generate import PromptCacheState

        state = self._states.pop(key, None) or PromptCacheState()
        held = state.token_ids
        if ids and held is not None and state.cache is not None:
            if len(held) >= len(ids) and held[:len(ids)] == ids:
                state.token_ids = list(ids[:-1])
            elif config is not None and not _text_suffix(
                    ids, state.find_prefix_length(ids), media_token_ids(config)):
                state = PromptCacheState()
        self._states[key] = state
        while len(self._states) > self.size:
            self._states.popitem(last=False)
        return state

    def reused(self, key: tuple, ids: list[int], config: Any) -> int:
        """Prompt tokens mlx-vlm will take from the cached state for ``ids`` (its own rule:
        a common prefix shorter than the prompt, followed by text only; audio tokens count
        as media here, :meth:`state` sees to it that mlx-vlm agrees)."""
        state = self._states.get(key)
        if state is None or state.cache is None:
            return 0
        n = min(state.find_prefix_length(ids), len(ids) - 1)  # see state()
        if not 0 < n < len(ids):
            return 0
        return n if _text_suffix(ids, n, media_token_ids(config)) else 0

    def drop(self, key: tuple) -> None:
        """Forget ``key``'s state (a generation stopped midway has changed its KV)."""
        self._states.pop(key, None)

    def clear(self) -> None:
        self._states.clear()
