"""How requests name a LoRA adapter (``local:NAME``) and how /v1/models lists them,
model-free: the real app over the stand-in engine, recording what reaches it. The
adapters' effect on a real model is tested in tests/server/test_adapters_model.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kit.models.aliases import AliasTable
from tests.server.test_metrics import StandInEngine, make_app


class RecordingEngine(StandInEngine):
    """The stand-in engine, keeping each request it is given (and counting 5 tokens for
    any prompt)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    async def count_tokens_async(self, request) -> int:
        return 5

    async def generate(self, request):
        self.seen.append(request)
        async for event in super().generate(request):
            yield event


@pytest.fixture
def served():
    engine = RecordingEngine()
    app = make_app(engine, adapters=("sql", "pirate"), adapters_for=engine.model_info.id)
    with TestClient(app) as client:
        yield client, engine


def chat(client, model, route="/v1/chat/completions"):
    """A one-turn request for ``model`` on ``route`` (its protocol's shape)."""
    if route == "gemini":
        return client.post(f"/v1beta/models/{model}:generateContent",
                           json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    if route == "/v1/responses":
        return client.post(route, json={"model": model, "input": "hi"})
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return client.post(route, json=body)


def test_models_lists_each_adapter_as_local_colon_name_after_local(served):
    client, _ = served
    data = client.get("/v1/models").json()["data"]
    ids = [m["id"] for m in data]
    assert ids[:3] == ["local", "local:sql", "local:pirate"]
    entry = data[1]
    assert entry["adapter"] == "sql" and entry["object"] == "model"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses",
                                   "gemini"])
def test_a_request_for_local_colon_name_runs_the_local_model_with_that_adapter(served, route):
    client, engine = served
    for model in ("local:sql", "local", "stand-in/model:pirate"):
        r = chat(client, model, route)
        assert r.status_code == 200, r.text
    # the adapter rides on the request; the model stays the one loaded (None: as for local)
    assert [r.adapter for r in engine.seen] == ["sql", None, "pirate"]


def test_health_names_the_adapters_served_now(served):
    client, _ = served
    assert client.get("/health").json()["adapters"] == ["local:sql", "local:pirate"]


def test_an_adapter_that_is_not_mounted_is_a_404_naming_the_model(served):
    client, engine = served
    r = chat(client, "local:nope")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "model" and "local:nope" in err["message"]
    assert "local:sql" in err["message"]  # what is available
    assert engine.seen == []


def test_adapters_are_not_offered_while_another_model_is_loaded():
    engine = RecordingEngine()
    app = make_app(engine, adapters=("sql",), adapters_for="other/model")
    with TestClient(app) as client:
        assert "local:sql" not in [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert client.get("/health").json()["adapters"] == []  # another model is loaded
        r = chat(client, "local:sql")
        assert r.status_code == 404 and "other/model" in r.json()["error"]["message"]
    assert engine.seen == []


def test_token_counts_and_gemini_model_lookups_take_an_adapter_name(served):
    """Regression: Claude Code's and Gemini CLI's token counts and Gemini's model lookup
    answered 404 for local:NAME (they skipped the adapter's name)."""
    client, _ = served
    messages = [{"role": "user", "content": "hi"}]
    r = client.post("/v1/messages/count_tokens", json={"model": "local:sql",
                                                        "messages": messages})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
    r = client.post("/v1beta/models/local:sql:countTokens",
                    json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 200 and r.json()["totalTokens"] > 0, r.text
    r = client.get("/v1beta/models/local:sql")
    assert r.status_code == 200 and r.json()["name"] == "models/local:sql"
    assert client.get("/v1/models/local:sql").json()["adapter"] == "sql"


def test_an_unknown_adapter_under_v1_models_is_openais_404_not_googles(served):
    client, _ = served
    r = client.get("/v1/models/local:nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_aliases_reach_adapters_and_an_unknown_base_is_a_404():
    engine = RecordingEngine()
    app = make_app(engine, adapters=("sql",), adapters_for=engine.model_info.id,
                   aliases=AliasTable.parse(["my-sql=local:sql"]))
    with TestClient(app) as client:
        # an alias to local:NAME, and NAME on a built-in alias of local
        for model in ("my-sql", "claude-sonnet-4:sql", "gpt-4o:sql"):
            assert chat(client, model).status_code == 200, model
        r = chat(client, "other/model:sql")
        assert r.status_code == 404 and "other/model:sql" in r.json()["error"]["message"]
        # regression: a typo behind a built-in alias was served by the base model
        for model in ("claude-sonnet-4:nope", "gpt-4o:SQL", "stand-in/model:nope"):
            r = chat(client, model)
            assert r.status_code == 404 and model in r.json()["error"]["message"], model
    assert [r.adapter for r in engine.seen] == ["sql", "sql", "sql"]
