"""The HTTP server: FastAPI app, one router per protocol, protocol-shaped errors.

Routers translate protocol requests into :class:`kit.engine.ChatRequest` and render the
engine's events; they hold no generation logic.
"""

from kit.server.app import create_app

__all__ = ["create_app"]
