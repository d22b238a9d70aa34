"""POST /v1/embeddings (OpenAI's shape): a string, a list of strings, a token-id list or a
list of them; ``encoding_format`` float or base64 (the official SDKs ask for base64 by
default); ``dimensions`` (the first N dimensions, L2-normalised again: right for
Matryoshka-trained models such as nomic-embed and Qwen3-Embedding, a cruder cut for
others); usage in tokens. Served by the embedding process (:mod:`kit.embed.process`) as
``local-embed`` or its real id.

Inputs past the model's window are cut to it, as Ollama and LM Studio do (``truncate``:
false, Ollama's field, makes them a 400 naming ``input.N`` instead). Each input and the
count of inputs are bounded (:mod:`kit.embed.wire`).
"""

from __future__ import annotations

import base64
import math
from typing import Annotated, Any, Literal, Union

import numpy as np
from fastapi import Request
from pydantic import Discriminator, Field, StrictBool, StrictInt, Tag

from kit.embed.process import EMBED_MODEL_ID, EmbedProcess
from kit.embed.wire import MAX_INPUT_TOKENS, MAX_INPUTS, MAX_TEXT_CHARS
from kit.server.adapter import protocol_router
from kit.server.content import Text
from kit.server.content.base import LenientModel
from kit.server.errors import APIError
from kit.server.openai_common import OPENAI_FIELDS
from kit.server.protocol import Protocol, under

router = protocol_router(OPENAI_FIELDS)

_Token = Annotated[StrictInt, Field(ge=0, lt=1 << 31)]
_Str = Annotated[Text, Field(max_length=MAX_TEXT_CHARS)]
_Ids = Annotated[list[_Token], Field(min_length=1, max_length=MAX_INPUT_TOKENS)]


def _input_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    first = value[0] if isinstance(value, list) and value else None
    return {int: "ids", list: "batch"}.get(type(first), "texts")


Input = Annotated[Union[
    Annotated[_Str, Tag("text")],
    Annotated[list[_Str], Field(min_length=1, max_length=MAX_INPUTS), Tag("texts")],
    Annotated[_Ids, Tag("ids")],
    Annotated[list[_Ids], Field(min_length=1, max_length=MAX_INPUTS), Tag("batch")]],
    Discriminator(_input_kind)]


class EmbeddingRequest(LenientModel):
    model: Annotated[str, Field(max_length=4096)]
    input: Input = Field(description="a text, a list of texts, a token-id list, or a list "
                         f"of token-id lists; at most {MAX_INPUTS} inputs")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1, le=1 << 16)
    truncate: StrictBool = True


def _embedder(request: Request, model: str) -> EmbedProcess:
    """The embedding process serving ``model``.

    Raises:
        APIError: 404 naming what is served when ``model`` is not the embedding model.
    """
    embedder: EmbedProcess | None = request.app.state.kit.embedder
    if embedder is None:
        raise APIError(404, f"model {model!r} is not an embedding model, and this server "
                       "serves none (start it with --embed-model)", type="not_found_error",
                       param="model", code="model_not_found")
    if model not in (EMBED_MODEL_ID, embedder.model_info.id):
        raise APIError(404, f"model {model!r} is not an embedding model; this server's is "
                       f"{EMBED_MODEL_ID!r} ({embedder.model_info.id})",
                       type="not_found_error", param="model", code="model_not_found")
    return embedder


def _rows(data: bytes, count: int, dims: int, keep: int | None) -> np.ndarray:
    vectors = np.frombuffer(data, dtype="<f4").reshape(count, dims)
    if keep is None or keep == dims:
        return vectors
    cut = vectors[:, :keep]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    embedder = _embedder(request, body.model)
    raw = body.input
    texts = [raw] if isinstance(raw, str) else raw if isinstance(raw[0], str) else None
    ids = None if texts is not None else [raw] if isinstance(raw[0], int) else raw
    if body.dimensions is not None and embedder.dims and body.dimensions > embedder.dims:
        raise APIError(400, f"dimensions {body.dimensions} is past the model's "
                       f"{embedder.dims}", param="dimensions", code="invalid_value")
    out = await embedder.embed(texts=texts, ids=ids, truncate=body.truncate)
    vectors = _rows(out.data, out.count, out.dims, body.dimensions)
    if body.encoding_format == "base64":
        items: list[Any] = [base64.b64encode(v.astype("<f4").tobytes()).decode()
                            for v in vectors]
    else:
        items = [[float(x) if math.isfinite(x) else 0.0 for x in v.tolist()]
                 for v in vectors]
    used = sum(out.tokens)
    return {"object": "list", "model": embedder.model_info.id,
            "data": [{"object": "embedding", "index": i, "embedding": e}
                     for i, e in enumerate(items)],
            "usage": {"prompt_tokens": used, "total_tokens": used}}


PROTOCOL = Protocol("openai-embeddings", router, under("/v1/embeddings"))
