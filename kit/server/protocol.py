"""What one protocol registers with the shared server: one :class:`Protocol` record per
protocol, listed once in :data:`kit.server.protocols.PROTOCOLS`.

The shared modules ask the record of a request's path (:func:`protocol_for`) instead of
matching URL paths themselves: the error body's shape (:mod:`kit.server.errors`), where
the API key is (:mod:`kit.server.auth`), the live-request label (:mod:`kit.server.live`)
and the routes (:mod:`kit.server.app`). Adding a protocol is its module, which defines
its ``PROTOCOL``, and one line in :data:`kit.server.protocols.PROTOCOLS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import APIRouter


@dataclass(frozen=True)
class Protocol:
    """One protocol's registration.

    Attributes:
        label: the name the status page and ``/metrics`` show for its live requests
            (``openai-chat``, ``anthropic``, ``gemini``...).
        router: its routes.
        matches: ``path -> bool``: whether a request path is this protocol's.
        error_body: ``APIError -> body dict`` in this protocol's error shape; None: OpenAI's
            (:meth:`kit.server.errors.APIError.body`).
        key_headers: headers that carry the API key, read before ``Authorization: Bearer``
            and ``x-api-key`` (every protocol accepts those two).
        key_query: query fields that carry the key (redacted from the access log).
    """

    label: str
    router: APIRouter
    matches: Callable[[str], bool]
    # Any: a kit.server.errors.APIError (errors reads these records, so no import back)
    error_body: Callable[[Any], dict[str, Any]] | None = None
    key_headers: tuple[str, ...] = ()
    key_query: tuple[str, ...] = ()


def under(*prefixes: str) -> Callable[[str], bool]:
    """A :attr:`Protocol.matches` for the paths that start with one of ``prefixes``."""
    return lambda path: path.startswith(prefixes)


def protocol_for(path: str, protocols: Iterable[Protocol]) -> Protocol | None:
    """The first of ``protocols`` whose :attr:`~Protocol.matches` takes ``path``, or None."""
    return next((p for p in protocols if p.matches(path)), None)
