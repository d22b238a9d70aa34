"""An unexpected exception is answered with our 500 and its traceback logged once (review
U5c: Starlette's handler re-raised, so uvicorn logged it a second time).

In-process on purpose: a real server has no route that fails unexpectedly (each such bug
gets fixed), so the engine here is a stand-in whose memory call raises."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient

from kit.server.app import create_app
from kit.server.guard import EdgePolicy
from kit.server.state import ServerState


class _BrokenEngine:
    """Stands in for EngineProcess: the one call /health makes fails unexpectedly."""

    async def current_memory(self):
        raise ZeroDivisionError("boom")


def test_unexpected_error_is_500_with_one_logged_traceback(caplog):
    app = create_app(ServerState(_BrokenEngine()),
                     edge=EdgePolicy.build("127.0.0.1", 8090, ["testserver"]))
    with caplog.at_level(logging.ERROR):
        r = TestClient(app, raise_server_exceptions=False).get("/health")
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "internal server error; see the server log",
                                 "type": "server_error", "param": None, "code": None}
    assert "boom" not in r.text and "Traceback" not in r.text
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1 and "GET /health" in tracebacks[0].getMessage()
