"""Template variables from a request are data, never code or renderer arguments (issue 11,
"bounded work"): ``chat_template_kwargs`` cannot carry a Jinja template or set an argument
of ``apply_chat_template``; anything the model's own template raises on a request is a 400.
Against the real server on loopback (``server``), and a server whose model has a template
that takes a variable (the starter's weights, linked)."""

from __future__ import annotations

import inspect
import json
import time

import httpx
import pytest

from kit.server.content import RESERVED_TEMPLATE_KEYS
from tests.helpers import start_server, starter_with_template, stop

USER = [{"role": "user", "content": "hi"}]
SLOW = "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}hi"


def chat(server, **body) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", timeout=120,
                      content=json.dumps({"model": "local", "messages": USER, "max_tokens": 3,
                                          **body}),
                      headers={"Content-Type": "application/json"})


def error_400(r: httpx.Response) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    return r.json()["error"]


def test_client_chat_template_is_refused_without_running_it(server):
    started = time.monotonic()
    err = error_400(chat(server, chat_template_kwargs={"chat_template": SLOW}))
    assert time.monotonic() - started < 10  # refused, not rendered (that took minutes)
    assert err["param"] == "chat_template_kwargs.chat_template"
    assert "set by the server" in err["message"]
    # the engine is free: the next request is answered
    assert chat(server).status_code == 200


@pytest.mark.parametrize("key", ["messages", "conversation", "tools", "tokenize",
                                 "add_generation_prompt", "return_dict", "tokenizer_kwargs",
                                 "continue_final_message", "documents"])
def test_renderer_argument_in_chat_template_kwargs_is_400_naming_it(server, key):
    err = error_400(chat(server, chat_template_kwargs={key: True}))
    assert err["param"] == f"chat_template_kwargs.{key}"
    assert "Template.render" not in err["message"] and "keyword argument" not in err["message"]


def test_plain_template_variables_are_still_accepted(server):
    r = chat(server, chat_template_kwargs={"enable_thinking": False, "custom": {"a": [1]}})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_reserved_keys_cover_the_installed_apply_chat_template():
    """Every named parameter of transformers' apply_chat_template is refused at the HTTP
    layer (a new transformers that adds one fails here, not on a user's request)."""
    from transformers import PreTrainedTokenizerBase

    params = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    named = {n for n, p in params.items()
             if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    assert named <= RESERVED_TEMPLATE_KEYS, named - RESERVED_TEMPLATE_KEYS
    assert "messages" in RESERVED_TEMPLATE_KEYS  # the renderer's own variable


# A model whose template loops over a request variable: range(10**9) is past the Jinja
# sandbox's range limit (OverflowError), which main answered with a 500 and a traceback.
LOOP_TEMPLATE = ("{% for i in range(loops | default(1)) %}{% endfor %}"
                 "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


@pytest.fixture(scope="module")
def loop_server(hf_home, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tpl")
    (folder / "loop.jinja").write_text(LOOP_TEMPLATE)
    model = starter_with_template(hf_home, folder / "smollm2-loop", folder / "loop.jinja")
    s = start_server(tmp_path_factory.mktemp("home-loop"), hf_home, "--model", str(model),
                     "--temperature", "0")
    yield s
    stop(s)


def test_template_error_on_a_request_is_400_not_500(loop_server):
    err = error_400(chat(loop_server, chat_template_kwargs={"loops": 10 ** 9}))
    assert err["message"].startswith("the model's chat template rejected the messages: ")
    assert "Traceback" not in err["message"] and len(err["message"]) < 400
    log = loop_server.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert chat(loop_server, chat_template_kwargs={"loops": 3}).status_code == 200
