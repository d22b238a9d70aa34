"""OpenAI's retrieve-model, ``GET /v1/models/{id}``: clients that ask for one model by id
(the OpenAI SDK's ``models.retrieve``) get the entry ``/v1/models`` lists, a 404 naming the
model otherwise; it was a 405. On the stand-in engine (the shapes, no model)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.server.test_metrics import make_app


@pytest.fixture(scope="module")
def client():
    with TestClient(make_app()) as c:
        yield c


def test_every_listed_model_is_retrieved_by_its_id_as_listed(client):
    listed = client.get("/v1/models").json()["data"]
    assert listed and listed[0]["id"] == "local"
    for entry in listed:
        r = client.get(f"/v1/models/{entry['id']}")
        assert r.status_code == 200, r.text
        assert r.json() == entry and r.json()["object"] == "model"


def test_an_unknown_model_is_a_404_model_not_found_naming_it(client):
    r = client.get("/v1/models/gpt-4o")
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'gpt-4o'" in error["message"] and "local" in error["message"]


def test_a_gemini_method_on_a_model_under_v1_is_still_gemini(client):
    # the retrieve route must not take Gemini's stable-version paths
    r = client.post("/v1/models/local:generateContent",
                    json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["candidates"][0]["content"]["parts"][0]["text"]


def test_the_openai_sdk_retrieves_local_and_gets_not_found_for_another(client):
    import openai

    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client,
                        max_retries=0)
    assert sdk.models.retrieve("local").id == "local"
    with pytest.raises(openai.NotFoundError, match="'gpt-4o' not found"):
        sdk.models.retrieve("gpt-4o")
