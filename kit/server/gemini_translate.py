"""The Gemini API's translation into the engine's ChatRequest (pure; the routes and the
renderer are in :mod:`kit.server.gemini`, the bodies in :mod:`kit.server.gemini_schemas`).

``systemInstruction`` -> a system message; ``model`` turns -> assistant messages
(``functionCall`` parts -> ``tool_calls``, ``thought`` parts dropped); ``functionResponse``
parts -> ``tool`` messages. ``toolConfig`` goes to the shared forced-tool-call machinery
(ANY -> required / named), a JSON ``responseMimeType`` with ``responseSchema`` /
``responseJsonSchema`` to constrained decoding, ``thinkingConfig`` to template variables.
On a vision model, ``inlineData`` images of user turns and function responses become
images (:mod:`kit.server.content.media` bounds them); what a local server cannot honour
(other media, and any on a text-only model; Google-side tools, ``cachedContent``,
``candidateCount`` > 1, logprobs, audio output) is a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from kit.engine.types import AudioInput, ChatRequest, ImageInput, SamplingParams
from kit.server.content.base import excerpt
from kit.server.content.media import (
    MediaReader,
    bad,
    refuse_file_id,
    refuse_remote,
)
from kit.server.errors import APIError
from kit.server.gemini_schemas import (
    SERVER_TOOLS,
    Content,
    GenerateContentRequest,
    GenerationConfig,
    to_json_schema,
)
from kit.server.translate import (
    choose_tools,
    function_schema,
    history_call,
    merge,
    output_cap,
    overridden,
    refuse_image_role,
    stop_strings,
    thinking_kwargs,
    with_media,
)

#: Gemini's names for the engine's neutral field names.
GEMINI_FIELDS = {"messages": "contents", "prompt": "contents",
                 "tool_choice": "toolConfig.functionCallingConfig",
                 "schema": "generationConfig.responseJsonSchema",
                 "top_k": "generationConfig.topK",
                 "max_tokens": "generationConfig.maxOutputTokens",
                 "template_kwargs": "generationConfig.thinkingConfig"}


def bad_field(message: str, param: str, code: str = "invalid_value") -> APIError:
    """The 400 for ``param`` (a Gemini field path), its message prefixed with the path."""
    return APIError(400, f"{param}: {message}", param=param, code=code)


# The part fields a text-only model cannot take, and their names on the wire.
_MEDIA_FIELDS = {"inline_data": "inlineData", "file_data": "fileData",
                 "executable_code": "executableCode",
                 "code_execution_result": "codeExecutionResult"}


def _refuse_media(part: Any, where: str, media: MediaReader | None = None,
                  role: str = "user") -> None:
    """Refuse ``part``'s media field, if it has one: as a text-only model does (``media``
    None or not vision), or, on a vision model, as a turn of ``role`` that takes no images
    (``system``, ``assistant``) or as what no model here takes (code execution)."""
    for field, name in _MEDIA_FIELDS.items():
        if getattr(part, field) is None:
            continue
        if media is not None and media.vision and field in ("inline_data", "file_data"):
            raise refuse_image_role(role, f"{where}.{name}",
                                    "images or audio" if media.audio else "images")
        if media is not None and media.vision:
            raise bad_field(f"{name} parts are not supported by this server",
                            f"{where}.{name}", code="unsupported_content")
        raise bad_field(f"{name} parts are not supported by this local text-only model",
                        f"{where}.{name}", code="unsupported_content")


def _inline(blob: Any, where: str, media: MediaReader) -> ImageInput | AudioInput:
    """A vision model's image of an ``inlineData`` blob (``{mimeType, data}``, base64);
    ``audio/*`` is bounded, then read by a model that takes audio (WAV) or refused; any
    other type refused.

    Raises:
        APIError: 400 naming ``where`` (the ``inlineData`` field's path).
    """
    if not isinstance(blob, dict):
        raise bad(where, "inlineData must be an object with mimeType and data",
                  "invalid_image")
    mime = blob.get("mimeType", blob.get("mime_type"))
    mime = mime.lower() if isinstance(mime, str) else ""
    if mime.startswith("image/"):
        return media.image_base64(blob.get("data"), where)
    if mime.startswith("audio/"):
        return media.audio_base64(blob.get("data"), mime, where)
    audio = "; audio is: audio/wav (PCM)" if media.audio else ""
    raise bad(where, f"{excerpt(mime or 'an untyped blob', 60)} content is not supported "
              f"by this model (images are: image/png, image/jpeg, image/webp, image/gif"
              f"{audio})", "unsupported_content")


def _file(blob: Any, where: str, media: MediaReader) -> ImageInput:
    """The image of a ``fileData`` part with a local path inside ``--image-dir``'s folders
    (:meth:`MediaReader.image_file`); anything else is refused: nothing is fetched, no
    file is read outside those folders, and no file store exists.

    Raises:
        APIError: 400 naming ``where``.
    """
    uri = blob.get("fileUri", blob.get("file_uri")) if isinstance(blob, dict) else None
    head = uri[:16].lower() if isinstance(uri, str) else ""
    if head.startswith(("file:", "/", "~", ".")):
        return media.image_file(uri, where)
    if head.startswith(("http://", "https://", "gs://")):
        raise refuse_remote(where)
    raise refuse_file_id(where)


def _user_media(p: Any, where: str,
                media: MediaReader | None) -> ImageInput | AudioInput | None:
    """The image of a user turn's part on a vision model (None: not a media part)."""
    if media is not None and media.vision:
        if p.inline_data is not None:
            return _inline(p.inline_data, f"{where}.inlineData", media)
        if p.file_data is not None:
            return _file(p.file_data, f"{where}.fileData", media)
    _refuse_media(p, where, media)
    return None


def _system(content: Content | None, media: MediaReader | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    texts = []
    for j, p in enumerate(content.parts):
        _refuse_media(p, f"systemInstruction.parts.{j}", media, "system")
        if p.text is not None and not p.thought:
            texts.append(p.text)
    return [{"role": "system", "content": "".join(texts)}] if texts else []


def _response_parts(fr: Any, where: str,
                    media: MediaReader | None) -> list[ImageInput | AudioInput]:
    """The images of a multimodal function response (``functionResponse.parts``, each
    ``{"inlineData": {...}}``) on a vision model.

    Raises:
        APIError: 400 on a text-only model, for a part that is not inline, or past a bound.
    """
    where = f"{where}.functionResponse.parts"
    if media is None or not media.vision:
        raise bad_field("multimodal function responses are not supported by this local "
                        "text-only model", where, code="unsupported_content")
    images = []
    for k, part in enumerate(fr.parts):
        blob = part.get("inlineData", part.get("inline_data"))
        file = part.get("fileData", part.get("file_data"))
        if blob is not None:
            images.append(_inline(blob, f"{where}.{k}.inlineData", media))
        elif file is not None:
            images.append(_file(file, f"{where}.{k}.fileData", media))
        else:
            raise bad(f"{where}.{k}", "a function response part holds inlineData",
                      "invalid_value")
    return images


def _response_text(response: dict[str, Any] | None) -> str:
    """A function result as the tool message's text: Gemini CLI's ``{"output": "..."}``
    as its string, anything else as compact JSON."""
    if isinstance(response, dict) and set(response) == {"output"} \
            and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response or {}, ensure_ascii=False, separators=(",", ":"))


def chat_messages(body: GenerateContentRequest,
                  media: MediaReader | None = None) -> list[dict[str, Any]]:
    """The chat messages for ``body`` (see the module docstring); on a vision model
    (``media.vision``) the ``inlineData`` images of user turns and of function responses'
    ``parts`` stay as images (:func:`~kit.server.translate.merge`; the
    :class:`ImageInput` items are swapped by :func:`~kit.server.translate.with_media`).

    Raises:
        APIError: 400 for media parts the model cannot take (any on a text-only model;
            images in systemInstruction or a model turn, audio, files, code execution),
            an image past a bound, a functionCall outside a model turn, a
            functionResponse inside one.
    """
    out = _system(body.system_instruction, media)
    open_calls: dict[str, list[str]] = {}  # name -> ids of calls without a response yet
    for i, c in enumerate(body.contents):
        texts: list[str] = []
        if c.role == "model":
            calls = []
            for j, p in enumerate(c.parts):
                where = f"contents.{i}.parts.{j}"
                _refuse_media(p, where, media, "assistant")
                if p.function_response is not None:
                    raise bad_field("functionResponse parts belong in a user turn",
                                    f"{where}.functionResponse")
                if p.function_call is not None:
                    fc = p.function_call
                    call_id = fc.id or f"call_{i}_{j}"
                    open_calls.setdefault(fc.name, []).append(call_id)
                    calls.append(history_call(call_id, fc.name, fc.args or {}))
                elif p.text is not None and not p.thought:
                    texts.append(p.text)
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        answered = False
        parts: list[Any] = []  # texts, and a vision model's images
        for j, p in enumerate(c.parts):
            where = f"contents.{i}.parts.{j}"
            image = _user_media(p, where, media)
            if image is not None:
                parts.append(image)
                continue
            if p.function_call is not None:
                raise bad_field("functionCall parts belong in a model turn",
                                f"{where}.functionCall")
            if p.function_response is not None:
                fr = p.function_response
                images = _response_parts(fr, where, media) if fr.parts else []
                pending = open_calls.get(fr.name) or []
                call_id = fr.id if fr.id else (pending[0] if pending else f"call_{i}_{j}")
                if call_id in pending:
                    pending.remove(call_id)
                out.append({"role": "tool", "tool_call_id": call_id, "name": fr.name,
                            "content": merge([_response_text(fr.response), *images])})
                answered = True
            elif p.text is not None and not p.thought:
                parts.append(p.text)
        if parts or not answered:
            out.append({"role": "user", "content": merge(parts)})
    return out


def chat_tools(body: GenerateContentRequest,
               supports_tools: bool) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The function declarations as chat-template tool schemas and the call to force
    (``toolConfig.functionCallingConfig``: AUTO / VALIDATED -> the model decides, NONE ->
    no tools, ANY -> a call to one of ``allowedFunctionNames`` or of all functions).

    Raises:
        APIError: 400 for a Google-side tool, a declaration with both parameter forms or a
            duplicate name, allowedFunctionNames outside mode ANY or naming an unknown
            function, a forced call on a model without tool support.
    """
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(body.tools or []):
        extra = tool.model_extra or {}
        for kind in SERVER_TOOLS:
            snake = "".join("_" + ch.lower() if ch.isupper() else ch for ch in kind)
            if extra.get(kind) is not None or extra.get(snake) is not None:
                raise bad_field(f"{kind} runs on Google's servers and is not available on a "
                                "local server", f"tools.{i}.{kind}", code="unsupported_value")
        for k, d in enumerate(tool.function_declarations or []):
            where = f"tools.{i}.functionDeclarations.{k}"
            if d.parameters is not None and d.parameters_json_schema is not None:
                raise bad_field("set parameters or parametersJsonSchema, not both", where)
            if any(t["function"]["name"] == d.name for t in tools):
                raise bad_field(f"duplicate function name {d.name!r}", f"{where}.name")
            try:
                params = to_json_schema(d.parameters_json_schema if d.parameters is None
                                        else d.parameters)
            except ValueError as e:
                raise bad_field(str(e), f"{where}.parameters") from None
            tools.append(function_schema(d.name, d.description,
                                         params or {"type": "object", "properties": {}}))
    fcc = body.tool_config.function_calling_config if body.tool_config else None
    mode = fcc.mode if fcc else "AUTO"
    allowed = list(fcc.allowed_function_names or []) if fcc else []
    where = "toolConfig.functionCallingConfig.allowedFunctionNames"
    if allowed and mode != "ANY":
        raise bad_field("allowedFunctionNames can only be set with mode ANY", where)
    for name in allowed:
        if not any(t["function"]["name"] == name for t in tools):
            raise bad_field(f"{name!r} is not among the function declarations", where)
    if mode == "ANY" and len(allowed) > 1:  # a call to one of a subset: offer only those
        tools = [t for t in tools if t["function"]["name"] in allowed]
    kind = {"NONE": "none", "ANY": "named" if len(allowed) == 1 else "required"}.get(mode,
                                                                                   "auto")
    return choose_tools(tools, kind, allowed[0] if allowed else None, supports_tools)


def _schema(g: GenerationConfig) -> dict[str, Any] | None:
    """The JSON schema the answer must follow (None: free text).

    Raises:
        APIError: 400 for a schema without JSON mode, both schema fields, another MIME type.
    """
    mime = (g.response_mime_type or "text/plain").lower()
    given = g.response_json_schema if g.response_json_schema is not None else g.response_schema
    if mime == "text/plain":
        if given is not None:
            raise bad_field("a response schema needs responseMimeType application/json",
                            "generationConfig.responseMimeType")
        return None
    if mime != "application/json":
        raise bad_field(f"{g.response_mime_type!r} is not supported (text/plain, application/json)",
                        "generationConfig.responseMimeType", code="unsupported_value")
    if g.response_json_schema is not None and g.response_schema is not None:
        raise bad_field("set responseSchema or responseJsonSchema, not both",
                        "generationConfig.responseSchema")
    try:
        return to_json_schema(given) if given else {"type": "object"}
    except ValueError as e:
        raise bad_field(str(e), "generationConfig.responseSchema") from None


def _template_kwargs(g: GenerationConfig) -> dict[str, Any]:
    """``thinkingConfig`` as chat-template variables: a budget of 0 or level MINIMAL turns
    thinking off, a level becomes ``reasoning_effort``; nothing when neither is set."""
    tc = g.thinking_config
    if tc is None:
        return {}
    level = tc.thinking_level if tc.thinking_level != "THINKING_LEVEL_UNSPECIFIED" else None
    return thinking_kwargs(level.lower() if level else None, budget=tc.thinking_budget,
                           field="generationConfig.thinkingConfig.thinkingLevel")


def to_engine_request(body: GenerateContentRequest, defaults: SamplingParams,
                      supports_tools: bool = False,
                      context_window: int | None = None,
                      media: MediaReader | None = None) -> ChatRequest:
    """Translate a ``generateContent`` body into the engine's :class:`ChatRequest`
    (``defaults`` fills the sampling fields the body omits; ``maxOutputTokens`` is a cap,
    as in Google's API: omitted or reaching ``context_window``, the engine fits it;
    ``media``: the request's media reader, see :func:`chat_messages`).

    Raises:
        APIError: 400 naming the field for what this server cannot honour.
        InvalidRequest: ``toolConfig`` that cannot be honoured.
    """
    g = body.generation_config or GenerationConfig()
    if body.cached_content:
        raise bad_field("this server stores no cached contents; send the whole conversation",
                        "cachedContent", code="unsupported_value")
    if g.candidate_count is not None and g.candidate_count > 1:
        raise bad_field("only 1 candidate is supported", "generationConfig.candidateCount",
                        code="unsupported_value")
    if any(m.upper() != "TEXT" for m in g.response_modalities or []):
        raise bad_field("only TEXT output is supported", "generationConfig.responseModalities",
                        code="unsupported_value")
    for field, name in (("response_logprobs", "responseLogprobs"), ("logprobs", "logprobs"),
                        ("speech_config", "speechConfig")):
        if getattr(g, field):
            raise bad_field("not supported by this server", f"generationConfig.{name}",
                            code="unsupported_value")
    params = overridden(defaults, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k)
    # Gemini's seed is an int32; mlx's is unsigned: a negative one maps to its two's complement
    seed = None if g.seed is None else g.seed % 2**32
    params = replace(params, max_tokens=output_cap(g.max_output_tokens, context_window),
                     stop=stop_strings(g.stop_sequences), seed=seed,
                     presence_penalty=g.presence_penalty, frequency_penalty=g.frequency_penalty)
    tools, force = chat_tools(body, supports_tools)
    return ChatRequest(**with_media(chat_messages(body, media)), params=params, tools=tools,
                       force_tool=force, parallel_tool_calls=True,  # Gemini has no switch
                       response_schema=_schema(g), template_kwargs=_template_kwargs(g))
