"""The local admin API (bearer: the admin token from this user's 0600 pid file; checked by
:class:`kit.server.auth.AuthMiddleware`): ``POST /admin/swap``, ``POST /admin/shutdown``."""

from __future__ import annotations

import os
import signal

from fastapi import APIRouter, BackgroundTasks, Request
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


def _terminate_self() -> None:
    # SIGTERM to our own pid: exactly the path `kill PID` / `mlx-kit stop` take (uvicorn
    # stops accepting, lets open requests finish for its grace period, the lifespan stops
    # the engine and removes the pid file), with no second shutdown code path to keep.
    os.kill(os.getpid(), signal.SIGTERM)


@router.post("/admin/shutdown")
async def shutdown(background: BackgroundTasks) -> dict:
    """Shut the server down gracefully, as SIGTERM does: 200 ``{"pid", "stopping": true}``
    is sent first, then the server stops (engine stopped, pid file removed). For ``mlx-kit
    stop`` when it cannot prove which local process is the server (the token proves the
    caller read this server's pid file)."""
    background.add_task(_terminate_self)
    return {"pid": os.getpid(), "stopping": True}
