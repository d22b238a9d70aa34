"""The local admin API (bearer: the admin token from the pid file): POST /admin/swap."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from kit.server.state import ServerState

router = APIRouter()


class SwapRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)


@router.post("/admin/swap")
async def swap(body: SwapRequest, request: Request) -> dict:
    """Make ``model`` the model behind ``local``: 200 ``{"model", "previous",
    "load_seconds", "changed"}``; 404 unknown model, 507 does not fit, 500 load failed —
    in every error case the old model keeps serving."""
    state: ServerState = request.app.state.kit
    return await state.swap(body.model)
