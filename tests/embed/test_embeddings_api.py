"""/v1/embeddings' shapes, bounds and refusals, model-free: the real app over the stand-in
chat engine and a stand-in embedding process (:class:`StandInEmbedder`, which answers
from a hash of each input instead of a model). The real model's vectors are checked in
tests/embed/test_embeddings_model.py."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kit.embed import wire
from kit.embed.process import EmbedProcess, Vectors
from kit.engine.proc.wire_records import WireError
from kit.errors import InvalidRequest
from kit.models.resolve import ModelInfo
from tests.server.test_metrics import make_app

DIMS, WINDOW = 8, 16


class StandInEmbedder(EmbedProcess):
    """An :class:`EmbedProcess` with no process: each input's vector comes from a hash of
    its text (or ids), one token per word (or id), the window :data:`WINDOW` tokens, and
    the same refusals as the model's (an input past the window without ``truncate``)."""

    def __init__(self) -> None:
        super().__init__(ModelInfo("org/stand-in-embed", Path("/nonexistent"), 512))
        self.state, self.dims, self.window, self.pooling = "ready", DIMS, WINDOW, "mean"
        self.calls: list[dict] = []

    async def embed(self, *, texts=None, ids=None, truncate=True) -> Vectors:
        self.calls.append({"texts": texts, "ids": ids, "truncate": truncate})
        inputs = [t.split() for t in texts] if texts is not None else ids
        rows, tokens = [], []
        for i, seq in enumerate(inputs):
            if len(seq) > WINDOW and not truncate:
                raise InvalidRequest(f"input[{i}] is past the window", field=f"input.{i}",
                                     code="context_length_exceeded")
            seq = seq[:WINDOW]
            digest = hashlib.sha256(repr(seq).encode()).digest()
            v = np.frombuffer(digest[:DIMS * 4], dtype="<u4").astype(np.float32) - 2**31
            rows.append(v / np.linalg.norm(v))
            tokens.append(len(seq))
        data = np.stack(rows).astype("<f4").tobytes()
        self.requests_served += 1
        return Vectors(data, len(rows), DIMS, tokens)


@pytest.fixture(scope="module")
def embedder():
    return StandInEmbedder()


@pytest.fixture(scope="module")
def client(embedder):
    with TestClient(make_app(embedder=embedder)) as c:
        yield c


def post(client, **body):
    return client.post("/v1/embeddings", json={"model": "local-embed", **body})


def test_a_list_of_texts_gets_one_normalised_vector_each_in_order_with_usage(client):
    r = post(client, input=["one two", "three", "four five six"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "org/stand-in-embed"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (3, DIMS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}


def test_one_text_and_the_real_model_id_are_accepted(client):
    one = post(client, input="one two").json()["data"]
    by_id = client.post("/v1/embeddings", json={"model": "org/stand-in-embed",
                                                "input": ["one two"]}).json()["data"]
    assert len(one) == 1 and one[0]["embedding"] == by_id[0]["embedding"]


def test_base64_is_the_same_float32_vector(client):
    floats = post(client, input=["alpha beta"]).json()["data"][0]["embedding"]
    encoded = post(client, input=["alpha beta"], encoding_format="base64").json()
    raw = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert raw.tolist() == pytest.approx(floats, abs=0)


def test_dimensions_keeps_the_first_n_renormalised(client):
    full = np.array(post(client, input=["x y"]).json()["data"][0]["embedding"])
    cut = np.array(post(client, input=["x y"], dimensions=3).json()["data"][0]["embedding"])
    assert cut.shape == (3,)
    assert np.allclose(cut, full[:3] / np.linalg.norm(full[:3]), atol=1e-6)


def test_dimensions_past_the_model_is_a_400_naming_it(client):
    r = post(client, input="x", dimensions=DIMS + 1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


def test_token_ids_one_list_or_several(client, embedder):
    one = post(client, input=[5, 6, 7])
    several = post(client, input=[[5, 6, 7], [8]])
    assert one.status_code == several.status_code == 200
    assert embedder.calls[-1]["ids"] == [[5, 6, 7], [8]] and embedder.calls[-1]["texts"] is None
    assert one.json()["data"][0]["embedding"] == several.json()["data"][0]["embedding"]
    assert several.json()["usage"]["prompt_tokens"] == 4


def test_inputs_past_the_window_are_cut_unless_truncate_is_false(client, embedder):
    long = " ".join(["w"] * (WINDOW + 5))
    assert post(client, input=long).json()["usage"]["prompt_tokens"] == WINDOW
    r = post(client, input=["short", long], truncate=False)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input.1" and error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("value, param", [
    ([], "input"), ("", None), (5, "input"), ([1.5], "input"), ([True], "input"),
    ([[]], "input"), ([-1], "input"), (["a", 1], "input"), ({"text": "a"}, "input")])
def test_malformed_input_is_a_400_naming_input(client, value, param):
    r = post(client, input=value)
    if param is None:  # an empty text is one input of no words, as Ollama takes it
        assert r.status_code == 200
        return
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_more_inputs_than_openai_allows_is_a_400(client):
    r = post(client, input=["a"] * (wire.MAX_INPUTS + 1))
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


@pytest.mark.parametrize("field, value", [("encoding_format", "int8"), ("dimensions", 0),
                                          ("dimensions", "4"), ("truncate", "no")])
def test_bad_options_are_a_400_naming_them(client, field, value):
    r = post(client, input="a", **{field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_a_chat_model_id_is_a_404_naming_the_embedding_model(client):
    r = client.post("/v1/embeddings", json={"model": "local", "input": "a"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["param"] == "model" and "'local-embed'" in error["message"]


def test_a_server_without_an_embedding_model_says_how_to_serve_one():
    with TestClient(make_app()) as c:
        r = c.post("/v1/embeddings", json={"model": "local-embed", "input": "a"})
        assert r.status_code == 404 and "--embed-model" in r.json()["error"]["message"]
        assert "embeddings" not in c.get("/health").json()
        assert all(m["id"] != "local-embed" for m in c.get("/v1/models").json()["data"])


def test_models_list_local_embed_last_as_an_embedding_model(client):
    data = client.get("/v1/models").json()["data"]
    assert data[0]["id"] == "local"
    entry = data[-1]
    assert entry["id"] == "local-embed" and entry["type"] == "embedding"
    assert entry["capabilities"]["embeddings"] is True
    assert entry["capabilities"]["tools"] is False and entry["dimensions"] == DIMS
    assert client.get("/v1/models/local-embed").json()["model"] == "org/stand-in-embed"


def test_health_reports_the_embedding_model(client):
    emb = client.get("/health").json()["embeddings"]
    assert emb["id"] == "local-embed" and emb["model"] == "org/stand-in-embed"
    assert emb["state"] == "ready" and emb["dims"] == DIMS and emb["window"] == WINDOW


def test_the_api_key_guards_embeddings_too(embedder):
    with TestClient(make_app(embedder=embedder, api_key="k")) as c:
        assert c.post("/v1/embeddings", json={"model": "local-embed",
                                              "input": "a"}).status_code == 401
        ok = c.post("/v1/embeddings", json={"model": "local-embed", "input": "a"},
                    headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200


# -- the pipe ----------------------------------------------------------------------------

def test_wire_records_round_trip_with_their_id():
    call = wire.EmbedCall(texts=["a", "b"], truncate=False)
    assert wire.decode(wire.encode(call, 7)) == (call, 7)
    ids = wire.EmbedCall(ids=[[1, 2]])
    assert wire.decode(wire.encode(ids, 9))[0].ids == [[1, 2]]


@pytest.mark.parametrize("frame, ident", [
    (b"MK", None),                                               # too short
    (b"XYZ\x01\x02" + bytes(8) + b"{}", None),                   # not our magic
    (b"MKE\x01\x63" + bytes(8) + b"{}", None),                   # an unknown kind
    (b"MKE\x01\x02" + (5).to_bytes(8, "big") + b'{"texts": [1]}', 5),   # not its schema
    (b"MKE\x01\x02" + (6).to_bytes(8, "big") + b'{"evil": "x"}', 6),    # a field not ours
])
def test_wire_refuses_frames_not_ours_naming_the_call_when_it_can(frame, ident):
    with pytest.raises(WireError) as e:
        wire.decode(frame)
    assert e.value.ident == ident


def test_wire_refuses_a_call_past_the_input_bound_before_it_is_sent():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        wire.EmbedCall(texts=["a"] * (wire.MAX_INPUTS + 1))


# -- the agents' configs ---------------------------------------------------------------

CHAT = {"id": "local", "name": "local (m)", "model": "org/m", "context_window": 8192,
        "max_tokens": 2048, "capabilities": {"tools": True, "reasoning": False,
                                             "vision": False}}
EMBED = StandInEmbedder().api_entry()


def _continue(models: list[dict]) -> dict:
    from ruamel.yaml import YAML

    from kit.harness.render import context, render
    from kit.harness.spec_loader import load_spec

    [text] = render(load_spec("continue"),
                    context("http://127.0.0.1:8090/v1", models, "t")).values()
    return YAML(typ="safe").load(text)


def test_the_embedding_entry_is_no_chat_model_in_the_template_context():
    from kit.harness.render import context

    ctx = context("http://127.0.0.1:8090/v1", [CHAT, EMBED], "t")
    assert [m["id"] for m in ctx["models"]] == ["local"]
    assert ctx["embed_model"]["id"] == "local-embed"
    assert context("http://127.0.0.1:8090/v1", [CHAT], "t")["embed_model"] is None


def test_continues_config_gains_an_embed_model_only_when_one_is_served():
    assert [m["roles"] for m in _continue([CHAT])["models"]] == [["chat", "edit", "apply"]]
    chat, embed = _continue([CHAT, EMBED])["models"]
    assert chat["model"] == "local"
    assert embed == {"name": "local-embed (org/stand-in-embed)", "provider": "openai",
                     "model": "local-embed", "apiBase": "http://127.0.0.1:8090/v1",
                     "apiKey": "${{ secrets.MLX_KIT_API_KEY }}", "roles": ["embed"],
                     "embedOptions": {"maxChunkSize": WINDOW}}
