"""The Gemini API's model listing (``GET /v1beta/models``, ``/v1beta/models/{model}``), the
404 for the methods not served (redacting Google's ``?key=`` from the access log is
:mod:`kit.server.auth`'s job). Included by :mod:`kit.server.gemini` after its method routes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from kit import STABLE_MODEL_ID
from kit.server.errors import APIError
from kit.server.state import ServerState

router = APIRouter()


async def not_served(rest: str) -> None:
    method = rest.rpartition(":")[2] if ":" in rest else rest
    raise APIError(404, f"{method!r} is not served by mlx-kit (generateContent, "
                   "streamGenerateContent and countTokens are)", type="not_found_error")


# Included after kit.server.gemini's method routes: embedContent, batchEmbedContents...
# are 404s (the GET route below would otherwise answer them 405).
for _version in ("v1beta", "v1"):
    router.add_api_route(f"/{_version}/models/{{rest:path}}", not_served, methods=["POST"])


def _model_entry(entry: dict[str, Any]) -> dict[str, Any]:
    window = entry.get("context_window") or 0
    return {"name": f"models/{entry['id']}", "baseModelId": entry["id"], "version": "mlx-kit",
            "displayName": entry["id"], "description": "served by mlx-kit",
            "inputTokenLimit": window, "outputTokenLimit": window,
            "supportedGenerationMethods": ["generateContent", "streamGenerateContent",
                                           "countTokens"],
            "thinking": bool((entry.get("capabilities") or {}).get("reasoning"))}


@router.get("/v1beta/models")
async def list_models(request: Request) -> dict:
    state: ServerState = request.app.state.kit
    return {"models": [_model_entry(e) for e in state.model_entries()]}


@router.get("/v1beta/models/{model:path}")
async def get_model(model: str, request: Request) -> dict:
    state: ServerState = request.app.state.kit
    name = model.removeprefix("models/")
    await state.resolve(name)  # 404 for a name that is not served
    entries = state.model_entries()
    real = next((e for e in entries if e["id"] == name), entries[0])  # aliases: local's
    return {**_model_entry(real), "name": f"models/{name}",
            "baseModelId": name if real["id"] == name else STABLE_MODEL_ID}
