"""Issue 25 item 4: the Gemini API key in a query string is redacted from the access log
in every spelling that authenticates. The redaction matched the text ``key=``, while the
authentication decodes field names as ``parse_qs`` does: ``?%6Bey=KEY`` logged in with the
key and left it in the log. Model-free: the two functions side by side, and the filter on
a real access-log record."""

from __future__ import annotations

import logging

import pytest
from starlette.datastructures import Headers

from kit.server.auth import gemini_key
from kit.server.gemini_catalog import _RedactKey, redact_query_key

SECRET = "s3cret-Key_1"
PATH = "/v1beta/models/local:generateContent"


@pytest.mark.parametrize("query", [
    f"key={SECRET}", f"%6Bey={SECRET}", f"k%65y={SECRET}", f"%6b%65%79={SECRET}",
    f"alt=sse&key={SECRET}", f"key={SECRET}&alt=sse", f"key={SECRET}&key=other",
    f"alt=sse&%6Bey={SECRET}&x=1", f"key={SECRET.replace('-', '%2D')}",
])
def test_every_query_spelling_that_authenticates_is_redacted(query):
    # the server reads the key from it ...
    decoded = gemini_key(Headers({}), query.encode())
    assert decoded == SECRET
    # ... and the log never shows it, in any spelling
    logged = redact_query_key(f"{PATH}?{query}")
    assert SECRET not in logged and SECRET.replace("-", "%2D") not in logged
    assert logged.startswith(PATH + "?") and "key=REDACTED" in logged


def test_other_fields_and_paths_without_a_query_stay_as_they_were():
    assert redact_query_key(f"{PATH}?alt=sse&monkey=1") == f"{PATH}?alt=sse&monkey=1"
    assert redact_query_key(PATH) == PATH


def test_the_access_log_filter_redacts_the_decoded_spelling():
    record = logging.makeLogRecord({
        "name": "uvicorn.access", "msg": '%s - "%s %s HTTP/%s" %d',
        "args": ("127.0.0.1:5", "POST", f"{PATH}?%6Bey={SECRET}", "1.1", 200)})
    assert _RedactKey().filter(record)
    assert SECRET not in record.getMessage() and "key=REDACTED" in record.getMessage()
