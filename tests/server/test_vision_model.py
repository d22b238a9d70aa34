"""Image input end to end on a vision model: a tiny random-weight Qwen2.5-VL built here with
mlx-vlm's own classes (bench/random_vlm.py; no real vision weights can be had offline), served
by one server as ``local``.

Its text is noise, so a user's checks are the ones that hold whatever the weights: the
answer to an image is exactly what mlx-vlm itself generates for the same prompt and pixels
(bytes -> processor -> image tokens -> model -> text); the image's tokens are counted in the
usage; a different image changes the answer and the same image does not; every protocol
(chat completions, Responses, Messages, Gemini), streamed or not, gives the same answer for
the same picture and words; a second turn about the same image comes from the prompt cache
and a turn with another image never does."""

from __future__ import annotations

import base64
import io

import httpx
import pytest

from tests.helpers import start_server, stop
from tests.server.test_adapters_model import starter_folder

pytestmark = pytest.mark.model

QUESTION = "Describe this image."
IMAGE_TOKENS_512 = 324  # 504x504 after resizing to the 28-pixel grid: 18x18 merged patches


def png(color: str, size: int = 512) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vlm(hf_home, tmp_path_factory):
    from bench.random_vlm import build

    return build(tmp_path_factory.mktemp("vlm") / "tiny-qwen2.5-vl", seed=0,
                 tokenizer=starter_folder(hf_home))


@pytest.fixture(scope="module")
def vision_server(hf_home, vlm, tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("home-vision"), hf_home, "--model", str(vlm),
                     "--temperature", "0")
    yield s
    stop(s)


def chat(server, image: bytes | None, text: str = QUESTION, history=(), max_tokens=10):
    content = ([{"type": "image_url", "image_url": {"url": data_url(image)}}] if image else
               []) + [{"type": "text", "text": text}]
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": "local", "max_tokens": max_tokens, "temperature": 0,
        "messages": [*history, {"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r.json()


def mlx_vlm_answer(folder, image: bytes, max_tokens: int = 10) -> str:
    """What mlx-vlm generates itself, greedy, for one user message [image, text]."""
    import mlx.core as mx
    from mlx_vlm import load, prepare_inputs, stream_generate
    from PIL import Image

    model, processor = load(str(folder))
    messages = [{"role": "user", "content": [{"type": "image"},
                                              {"type": "text", "text": QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True,
                                           tokenize=False)
    inputs = prepare_inputs(processor, images=[Image.open(io.BytesIO(image)).convert("RGB")],
                            prompts=prompt)
    extra = {k: v for k, v in inputs.items()
             if k not in ("input_ids", "pixel_values", "attention_mask")}
    text = "".join(r.text for r in stream_generate(
        model, processor, prompt, input_ids=inputs["input_ids"],
        pixel_values=inputs["pixel_values"], mask=inputs["attention_mask"],
        max_tokens=max_tokens, temperature=0.0, **extra))
    mx.clear_cache()
    return text


def test_the_model_says_it_takes_images_and_decodes_one_request_at_a_time(vision_server):
    local = httpx.get(vision_server.v1 + "/models").json()["data"][0]
    assert local["id"] == "local" and local["capabilities"]["vision"] is True
    assert vision_server.health()["kv_cache"]["max_batch"] == 1


def test_an_image_answer_is_mlx_vlms_own_and_counts_the_image_tokens(vision_server, vlm):
    red = png("red")
    body = chat(vision_server, red)
    text_only = chat(vision_server, None)
    # <|vision_start|>, one <|image_pad|> per merged patch, <|vision_end|>
    assert body["usage"]["prompt_tokens"] == \
        text_only["usage"]["prompt_tokens"] + 2 + IMAGE_TOKENS_512
    assert body["choices"][0]["message"]["content"] == mlx_vlm_answer(vlm, red)


def test_gemini_usage_counts_the_image_tokens_apart_from_the_text(vision_server):
    """usageMetadata.promptTokensDetails names the image's placeholder tokens as IMAGE and
    the rest as TEXT (it named all of them TEXT); OpenAI's usage has no image count."""
    from google.genai import types

    from tests.server.test_gemini import make_client

    contents = [types.Content(role="user", parts=[
        types.Part.from_bytes(data=png("blue"), mime_type="image/png"),
        types.Part(text=QUESTION)])]
    gem = make_client(vision_server.root)  # kept: the SDK closes its client when collected
    usage = gem.models.generate_content(
        model="local", contents=contents,
        config=types.GenerateContentConfig(max_output_tokens=4)).usage_metadata
    details = {d.modality.value: d.token_count for d in usage.prompt_tokens_details}
    assert details == {"TEXT": usage.prompt_token_count - IMAGE_TOKENS_512,
                       "IMAGE": IMAGE_TOKENS_512}


def test_another_image_changes_the_answer_and_the_same_one_does_not(vision_server):
    first = chat(vision_server, png("red"))["choices"][0]["message"]["content"]
    again = chat(vision_server, png("red"))["choices"][0]["message"]["content"]
    other = chat(vision_server, png("blue"))["choices"][0]["message"]["content"]
    assert first == again and first != other


def test_a_second_turn_about_the_same_image_comes_from_the_prompt_cache(vision_server):
    red, green = png("red"), png("green")  # green: no other test sends it
    first = chat(vision_server, red)
    history = [{"role": "user", "content": [
                   {"type": "image_url", "image_url": {"url": data_url(red)}},
                   {"type": "text", "text": QUESTION}]},
               {"role": "assistant", "content": first["choices"][0]["message"]["content"]}]
    second = chat(vision_server, None, "And its colour?", history=history)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > first["usage"]["prompt_tokens"] - 5  # the image and the first answer
    # the same words about another picture: its image tokens are the same ids, and still
    # nothing of the red conversation's KV may serve it
    history[0]["content"][0]["image_url"]["url"] = data_url(green)
    third = chat(vision_server, None, "And its colour?", history=history)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def each_protocol(server, image: bytes, text: str = QUESTION) -> dict[str, str]:
    """The answer to one user message [image, text] on every protocol through its official
    SDK, streamed and not (10 tokens; greedy: the server runs with --temperature 0)."""
    from google.genai import types

    from tests.helpers import anthropic_for, openai_for
    from tests.server.test_gemini import make_client

    oa, an = openai_for(server), anthropic_for(server)
    encoded = base64.b64encode(image).decode()
    chat_msgs = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image)}},
        {"type": "text", "text": text}]}]
    resp_input = [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(image)},
        {"type": "input_text", "text": text}]}]
    msgs = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": encoded}},
        {"type": "text", "text": text}]}]
    contents = [types.Content(role="user", parts=[
        types.Part.from_bytes(data=image, mime_type="image/png"), types.Part(text=text)])]
    config = types.GenerateContentConfig(max_output_tokens=10)
    gem = make_client(server.root)
    out = {
        "chat": oa.chat.completions.create(model="local", messages=chat_msgs, max_tokens=10).choices[0].message.content,
        "chat stream": "".join(c.choices[0].delta.content or "" for c in
                               oa.chat.completions.create(
                                   model="local", messages=chat_msgs, max_tokens=10,
                                   stream=True) if c.choices),
        "responses": oa.responses.create(model="local", input=resp_input,
                                         max_output_tokens=10).output_text,
        "messages": an.messages.create(model="local", messages=msgs, max_tokens=10).content[0].text,
        "gemini": gem.models.generate_content(model="local", contents=contents,
                                              config=config).text,
        "gemini stream": "".join(c.text or "" for c in gem.models.generate_content_stream(
            model="local", contents=contents, config=config)),
    }
    # 10 tokens end it "incomplete" (max_output_tokens), so no response.completed: the deltas
    out["responses stream"] = "".join(
        e.delta for e in oa.responses.create(model="local", input=resp_input, stream=True,
                                             max_output_tokens=10)
        if e.type == "response.output_text.delta")
    with an.messages.stream(model="local", messages=msgs, max_tokens=10) as s:
        out["messages stream"] = s.get_final_text()
    return out


def test_every_protocol_streamed_or_not_gives_the_same_answer_to_the_same_image(
        vision_server):
    answers = each_protocol(vision_server, png("purple"))
    expected = chat(vision_server, png("purple"))["choices"][0]["message"]["content"]
    assert expected and answers == {k: expected for k in answers}


def test_a_screenshot_inside_a_tool_result_reaches_the_model(vision_server):
    from tests.helpers import anthropic_for

    an = anthropic_for(vision_server)
    encoded = base64.b64encode(png("orange")).decode()
    tool = {"name": "screenshot", "description": "Take a screenshot.",
            "input_schema": {"type": "object", "properties": {}}}
    history = [{"role": "user", "content": "What is on my screen?"},
               {"role": "assistant", "content": [
                   {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]}]

    def ask(result_content):
        msgs = [*history, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}]}]
        counted = an.messages.count_tokens(model="local", messages=msgs, tools=[tool])
        reply = an.messages.create(model="local", messages=msgs, tools=[tool], max_tokens=10)
        assert counted.input_tokens == reply.usage.input_tokens
        return reply

    with_image = ask([{"type": "text", "text": "Here it is."},
                      {"type": "image", "source": {"type": "base64",
                                                   "media_type": "image/png",
                                                   "data": encoded}}])
    text_only = ask([{"type": "text", "text": "Here it is."}])
    assert with_image.usage.input_tokens == \
        text_only.usage.input_tokens + 2 + IMAGE_TOKENS_512


def test_a_retried_request_reuses_its_prompt_cache_and_answers_the_same(vision_server):
    image = png("navy")  # no other test sends it
    first = chat(vision_server, image)
    retry = chat(vision_server, image)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # all but the last prompt token: mlx-vlm prefills at least one
    assert retry["usage"]["prompt_tokens_details"]["cached_tokens"] == \
        retry["usage"]["prompt_tokens"] - 1
    assert retry["choices"][0]["message"] == first["choices"][0]["message"]


def test_a_photo_is_scaled_to_the_image_token_cap(vision_server):
    from PIL import Image

    from tests.helpers import anthropic_for

    buf = io.BytesIO()
    Image.new("RGB", (2000, 1500), "olive").save(buf, format="JPEG")  # 3,857 tokens unscaled
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": base64.b64encode(buf.getvalue()).decode()}}
    an = anthropic_for(vision_server)
    counted = an.messages.count_tokens(model="local", messages=[
        {"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}])
    text_only = an.messages.count_tokens(model="local", messages=[
        {"role": "user", "content": QUESTION}])
    image_tokens = counted.input_tokens - text_only.input_tokens - 2
    assert 1500 < image_tokens <= 2048  # --max-image-tokens' default
