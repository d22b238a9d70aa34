"""``--force-sampling``: the server's sampling for every request, on every protocol, whatever
the request sets; without it a request's own sampling wins. In-process, over the stand-in
engine, which records the parameters each request reached it with."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kit.engine.types import SamplingParams
from tests.server.test_metrics import StandInEngine, make_app

HI = [{"role": "user", "content": "Hi"}]
#: each protocol's route and a body that sets temperature 1 and top_p 0.5
BODIES = {
    "chat": ("/v1/chat/completions",
             {"model": "local", "messages": HI, "temperature": 1, "top_p": 0.5}),
    "completions": ("/v1/completions",
                    {"model": "local", "prompt": "Hi", "temperature": 1, "top_p": 0.5}),
    "responses": ("/v1/responses",
                  {"model": "local", "input": "Hi", "temperature": 1, "top_p": 0.5}),
    "messages": ("/v1/messages", {"model": "local", "messages": HI, "max_tokens": 8,
                                  "temperature": 1, "top_p": 0.5, "top_k": 40}),
    "gemini": ("/v1beta/models/local:generateContent",
               {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                "generationConfig": {"temperature": 1, "topP": 0.5, "topK": 40}}),
}


class RecordingEngine(StandInEngine):
    """The stand-in engine, keeping each request's sampling parameters."""

    def __init__(self) -> None:
        super().__init__(words=2)
        self.params: list[SamplingParams] = []

    async def generate(self, request):
        self.params.append(request.params)
        async for event in super().generate(request):
            yield event


@pytest.mark.parametrize("protocol", BODIES)
def test_force_sampling_replaces_what_a_request_sets(protocol):
    engine = RecordingEngine()
    path, body = BODIES[protocol]
    with TestClient(make_app(engine, default_temperature=0.0, default_top_p=0.9,
                             force_sampling=True)) as client:
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        health = client.get("/health").json()
    (params,) = engine.params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.0, 0.9, 0, 0.0)
    assert health["sampling_defaults"]["forced"] is True


@pytest.mark.parametrize("protocol", BODIES)
def test_without_force_sampling_the_requests_own_sampling_wins(protocol):
    engine = RecordingEngine()
    path, body = BODIES[protocol]
    with TestClient(make_app(engine, default_temperature=0.0)) as client:
        assert client.post(path, json=body).status_code == 200
    (params,) = engine.params
    assert (params.temperature, params.top_p) == (1.0, 0.5)
