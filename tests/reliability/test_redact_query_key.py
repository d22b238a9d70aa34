"""The API key in a Gemini query string (``?key=KEY``) is redacted in every spelling that
authenticates (issue 25, finding 4): the check and the redaction share one decoding
(:func:`kit.server.auth.query_fields`), so percent-encoded names and values, ``+`` for a
space, a blank first ``key`` and repeated keys all authenticate and all read ``REDACTED``
in uvicorn's access log; nor does the key reach the status page, ``/metrics`` or an error.
A real uvicorn on loopback serves the app on the stand-in engine (the access log, the
auth and the routes are the server's own)."""

from __future__ import annotations

import json
import logging
import threading
from urllib.parse import quote_plus, unquote_plus

import httpx
import pytest
from hypothesis import given, settings, strategies as st
from starlette.datastructures import Headers

from kit.server import gemini
from kit.server.auth import REDACTED, key_of, query_fields, redact_query
from tests.helpers import wait_until
from tests.server.test_metrics import StandInEngine
from tests.server.test_status_page import in_process_server

KEY = "gem-s3cret key"  # a space: sent as "+" or "%20"
SECRET = "s3cret"
BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GENERATE = "/v1beta/models/local:generateContent"
BEARER = {"Authorization": f"Bearer {KEY}"}
ENCODED = "".join(f"%{b:02X}" for b in KEY.encode())

#: query strings that authenticate with KEY, each spelled another way
AUTHENTICATING = [
    "key=gem-s3cret+key",
    "key=gem-s3cret%20key",
    "%6Bey=gem-s3cret+key",             # the name percent-encoded
    "%6b%65%79=gem-s3cret%20key",       # lower-case escapes
    f"key={ENCODED}",                   # the value percent-encoded throughout
    "key=&key=gem-s3cret+key",          # a blank key first: the first non-blank counts
    "key&key=gem-s3cret+key",           # a bare name first
    "x=1&&key=gem-s3cret+key&y=2",      # an empty field between
    "key=gem-s3cret+key&key=gem-s3cret+key",
    "key=gem-s3cret+key&key=other",     # repeated: the first counts, both are redacted
]
#: query strings carrying the key that do not authenticate: still redacted
REFUSED = ["KEY=gem-s3cret+key", "Key=gem-s3cret%20key", "%4B%45%59=gem-s3cret+key"]


def _leaks(text: str) -> bool:
    """Whether ``text`` shows the key's secret part, as sent or percent-decoded (twice)."""
    return any(SECRET in t for t in (text, unquote_plus(text), unquote_plus(unquote_plus(text))))


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def keyed():
    """(root URL, the access log's lines so far) of an in-process server requiring KEY."""
    access = logging.getLogger("uvicorn.access")
    lines = _Lines()
    with in_process_server(StandInEngine(words=2), log_level="info", api_key=KEY) as root:
        access.addHandler(lines)  # after uvicorn's own logging setup, which replaces handlers
        try:
            yield root, lines.lines
        finally:
            access.removeHandler(lines)


@pytest.mark.parametrize("query", AUTHENTICATING)
def test_every_spelling_of_the_query_key_that_authenticates_is_redacted(keyed, query):
    root, lines = keyed
    r = httpx.post(f"{root}{GENERATE}?{query}", json=BODY, timeout=30)
    assert r.status_code == 200, r.text
    line = next(line for line in lines if "generateContent" in line)
    assert REDACTED in line and not _leaks(line), line
    for path in ("/ui/data", "/metrics"):
        page = httpx.get(root + path, headers=BEARER, timeout=30)
        assert page.status_code == 200 and not _leaks(page.text), path


def test_a_live_request_with_the_query_key_shows_on_the_status_page_without_it():
    engine = StandInEngine(words=2)
    engine.gate = threading.Event()  # held in the queue: listed live
    with in_process_server(engine, api_key=KEY) as root:
        held = threading.Thread(target=lambda: httpx.post(
            f"{root}{GENERATE}?%6Bey=gem-s3cret+key", json=BODY, timeout=60))
        held.start()
        try:
            page = wait_until(lambda: (p := httpx.get(root + "/ui/data", headers=BEARER,
                                                      timeout=10).json())["live"] and p,
                              timeout=30, what="the held request being listed")
            assert page["live"][0]["protocol"] == "gemini" and not _leaks(json.dumps(page))
        finally:
            engine.gate.set()
            held.join(60)


@pytest.mark.parametrize("query", REFUSED)
def test_a_query_key_spelled_so_it_does_not_authenticate_is_refused_and_still_redacted(
        keyed, query):
    root, lines = keyed
    r = httpx.post(f"{root}{GENERATE}?{query}", json=BODY, timeout=30)
    assert r.status_code == 401 and not _leaks(r.text)
    line = next(line for line in lines if "generateContent" in line)
    assert REDACTED in line and not _leaks(line), line


def test_a_key_in_the_query_of_an_openai_route_is_redacted_too(keyed):
    root, lines = keyed
    r = httpx.get(f"{root}/v1/models?key={quote_plus(KEY)}", timeout=30)
    assert r.status_code == 401  # /v1 routes take no query key
    line = next(line for line in lines if "/v1/models" in line)
    assert REDACTED in line and not _leaks(line), line


# A query built of fields: names and values drawn from what the decoding treats specially.
_NAME = st.sampled_from(["key", "KEY", "%6Bey", "%6b%65%79", "k%65y", "alt", "x", "", "key "])
_VALUE = st.sampled_from(["", "gem-s3cret+key", "gem-s3cret%20key", ENCODED, "a%26key%3Db",
                          "%", "%zz", "sse", "+", "a=b"])
_FIELD = st.one_of(st.tuples(_NAME, _VALUE).map("=".join), _NAME)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FIELD, max_size=6))
def test_whatever_a_query_authenticates_with_is_gone_after_redaction(fields):
    query = "&".join(fields)
    redacted = redact_query("/v1beta/models/local:generateContent?" + query).partition("?")[2]
    assert key_of(gemini.PROTOCOL, Headers(), redacted.encode()) in ("", REDACTED)
    assert all(f.value == REDACTED or f.start == f.end for f in query_fields(redacted)
               if f.name.casefold() == "key")
    other = [f for f in query_fields(query) if f.name.casefold() != "key"]
    assert [(f.name, f.value) for f in query_fields(redacted) if f.name.casefold() != "key"] \
        == [(f.name, f.value) for f in other], "fields that are not the key are kept"
