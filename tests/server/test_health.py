"""/health's body is :class:`kit.health.HealthBody`, built from the engine's typed
``status()``: same field names and values as before, documented in the OpenAPI schema, and
what the CLI's probe parses."""

from __future__ import annotations

from fastapi.testclient import TestClient

from kit.engine.status import EngineStatus
from kit.health import HealthBody, parse_health
from tests.server.test_metrics import ADMISSION, StandInEngine, make_app

#: /health's keys as clients (tests, agents, the CLI) read them
KEYS = {"service", "version", "status", "model_state", "model", "context_window", "pid",
        "requests_served", "swaps", "reloads", "unloads", "restarts", "engine_pid", "ttl",
        "load_seconds", "phase", "swaps_pending", "memory", "error", "error_type",
        "prompt_cache", "sampling_defaults"}


def test_health_is_a_health_body_with_the_same_keys_and_values():
    prompt_cache = {"memory_hits": 1, "disk_hits": 0, "misses": 2}
    engine = StandInEngine(prompt_cache=prompt_cache, admission=ADMISSION)
    r = TestClient(make_app(engine)).get("/health")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == KEYS | {"admission"}  # kv_cache, distributed: absent until reported
    assert body["service"] == "mlx-kit" and body["status"] == "ok"
    assert body["model_state"] == "ready" and body["model"] == "stand-in/model"
    assert body["context_window"] == 2048 and body["engine_pid"] == 1
    assert body["memory"] == {"active_bytes": 3_000_000, "peak_bytes": 4_000_000,
                              "weights_bytes": 2_000_000}
    assert body["prompt_cache"] == prompt_cache and body["admission"] == ADMISSION
    assert body["sampling_defaults"] == {"temperature": 0.7, "top_p": 1.0, "top_k": 0,
                                         "min_p": 0.0, "forced": False}
    parsed = HealthBody.model_validate(body)
    assert parsed.ok and parsed.to_json() == body  # parse and re-dump lose nothing


def test_a_failed_engine_is_503_with_its_reason_and_kind():
    engine = StandInEngine()
    engine.state, engine.error, engine.error_type = "failed", "too big", "model_does_not_fit"
    r = TestClient(make_app(engine)).get("/health")
    assert r.status_code == 503
    h = parse_health(r.json())
    assert h is not None and not h.ok and h.status == "failed" and h.model_state == "failed"
    assert (h.error, h.error_type) == ("too big", "model_does_not_fit")


def test_the_openapi_schema_documents_the_health_body():
    schema = make_app().openapi()  # what /openapi.json serves (on for a loopback bind)
    op = schema["paths"]["/health"]["get"]
    for code in ("200", "503"):
        ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/HealthBody")
    props = schema["components"]["schemas"]["HealthBody"]["properties"]
    assert KEYS <= set(props) and "description" in props["error_type"]


def test_the_probe_refuses_what_is_not_our_body():
    assert parse_health({"service": "other"}) is None
    assert parse_health({"service": "mlx-kit", "status": 3, "model_state": []}) is None
    minimal = parse_health({"service": "mlx-kit", "status": "ok", "pid": 7})  # still ours
    assert minimal is not None and minimal.ok and minimal.pid == 7
    newer = parse_health({"service": "mlx-kit", "status": "ok", "model_state": "ready",
                          "a_field_of_a_newer_server": 1})
    assert newer is not None and newer.to_json()["a_field_of_a_newer_server"] == 1


def test_every_engine_status_field_reaches_the_body_or_is_the_servers():
    shared = set(EngineStatus.model_fields) - {"state", "pid", "capabilities"}
    assert shared <= set(HealthBody.model_fields)
