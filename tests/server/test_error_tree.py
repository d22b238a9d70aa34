"""The one error tree: each cause maps to its status by type, in every protocol's words."""


import pytest

from kit.errors import (
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    KitError,
    ModelDoesNotFitError,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailable,
)
from kit.models.resolve import InvalidModelSpec
from kit.server.errors import api_error
from kit.server.openai_common import OPENAI_FIELDS


@pytest.mark.parametrize("error, status, code", [
    (InvalidRequest("too long", code="context_length_exceeded"), 400, "context_length_exceeded"),
    (InvalidModelSpec("/etc is not a model"), 400, "invalid_model"),
    (ModelNotFoundError("nope", ["local"]), 404, "model_not_found"),
    (ModelUnavailable("'x' is not loaded"), 404, "model_not_found"),
    (ModelDoesNotFitError("big does not fit", needed=10, budget=5), 507, "insufficient_memory"),
    (ModelLoadError("the model failed to load: bad weights"), 503, "model_load_failed"),
    (EngineUnavailable("the server is shutting down"), 503, None),
    (ModelError("cannot load x: truncated"), 500, "model_load_failed"),
    (EngineError("generation failed: boom"), 500, None),
])
def test_each_cause_maps_to_its_status_by_type(error, status, code):
    api = api_error(error)
    assert (api.status, api.code) == (status, code)
    assert isinstance(error, KitError)


def test_the_mapping_reads_the_type_not_the_message():
    # "does not fit" / "failed to load" in a message no longer decide the status
    assert api_error(ModelError("x does not fit anywhere")).status == 500
    assert api_error(EngineError("the model failed to load")).status == 500


def test_a_neutral_field_gets_the_protocols_name():
    e = InvalidRequest("bad schema", field="schema")
    assert api_error(e, OPENAI_FIELDS).param == "response_format"
    assert api_error(e, {"schema": "text.format"}).param == "text.format"
    kw = InvalidRequest("set by the server", field="template_kwargs.tokenize")
    assert api_error(kw, OPENAI_FIELDS).param == "chat_template_kwargs.tokenize"
    assert api_error(InvalidRequest("no tokens", field="prompt")).param == "prompt"


def test_engine_errors_cross_the_process_pipe_with_their_fields():
    from kit.engine.proc import wire

    def across(error):  # as the engine process sends a failed request's error
        return wire.decode(wire.encode(("ev", 1, error)))[2]
    e = across(InvalidRequest("m", code="c", field="top_k"))
    assert (type(e), e.message, e.code, e.field) == (InvalidRequest, "m", "c", "top_k")
    fit = across(ModelDoesNotFitError("m", "h", needed=3, budget=2))
    assert (fit.hint, fit.needed, fit.budget) == ("h", 3, 2)


def test_engine_errors_keep_their_fields_when_copied():
    import copy

    e = copy.deepcopy(InvalidRequest("m", code="c", field="top_k"))
    assert (type(e), e.message, e.code, e.field) == (InvalidRequest, "m", "c", "top_k")
    fit = copy.copy(ModelDoesNotFitError("m", "h", needed=3, budget=2))
    assert (fit.hint, fit.needed, fit.budget) == ("h", 3, 2)


def test_a_completions_prompt_too_long_names_prompt_not_messages():
    """/v1/completions has no `messages`: its context-length error named param
    "messages" (the engine's neutral word), a field the client never sent."""
    from kit.server.openai_completions import COMPLETIONS_FIELDS

    e = InvalidRequest("too long", code="context_length_exceeded")  # field: messages
    assert api_error(e, COMPLETIONS_FIELDS).param == "prompt"
    assert api_error(InvalidRequest("bad", field="schema"), COMPLETIONS_FIELDS).param == \
        "response_format"
