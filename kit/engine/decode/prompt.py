"""Prompts: a request's token ids, through the model's chat template or as given.

:class:`Prompts` renders messages with the chat template (guarding the renderer's own
arguments against template variables), encodes them, rejects prompts that cannot fit the
context window (by a proven lower bound before tokenizing, see
:mod:`kit.engine.decode.prompt_bound`, then by the exact count), and builds the output
constraint of a forced tool call or a response schema (:mod:`kit.engine.decode.grammar`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kit import mlx_lm_api
from kit.engine.cache.reclaim import LARGE_BYTES
from kit.engine.decode import vision
from kit.engine.decode.grammar import json_grammar, tool_call_grammar
from kit.engine.decode.sampling import max_tokens as budget
from kit.engine.decode.slot import ModelSlot
from kit.engine.types import ChatRequest, InvalidRequest


def excerpt(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, for error messages that may quote input."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def reserved_template_keys(tokenizer: Any) -> frozenset[str]:
    """The names a request's template variables may not take: the named parameters of
    ``tokenizer.apply_chat_template`` (read from the installed transformers, so a new one
    is covered) and the variables its renderer sets itself."""
    try:
        params = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    except (AttributeError, TypeError, ValueError):
        params = ()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(named | {"messages", "conversation", "tools", "documents",
                              "chat_template", "add_generation_prompt", "tokenize"})


class Prompts:
    """Prompt rendering for the model in ``slot``. Only reads the tokenizer, so
    :meth:`tokens` may run beside the worker (``count_tokens``)."""

    def __init__(self, slot: ModelSlot) -> None:
        self.slot = slot

    def tokens(self, request: ChatRequest, max_tokens: int | None,
               on_large: Callable[[], None] | None = None) -> list[int]:
        """:meth:`prompt`'s token ids (what ``count_tokens`` counts)."""
        return self.prompt(request, max_tokens, on_large)[0]

    def prompt(self, request: ChatRequest, max_tokens: int | None,
               on_large: Callable[[], None] | None = None
               ) -> tuple[list[int], dict[str, Any] | None]:
        """The prompt's token ids: the raw prompt, or the messages through the chat
        template; and, for a vision model (:mod:`kit.engine.decode.vision`), the
        processor's arrays (pixel values...; None for a text model), the ids then
        holding each image's tokens. Before tokenizing, a prompt that provably cannot fit the window with
        ``max_tokens`` more (None: with at least one more) is rejected on the lower bound
        of :mod:`kit.engine.decode.prompt_bound` (a 20 MB prompt costs milliseconds, not a
        minute of tokenizing); what the bound does not decide is tokenized exactly and
        checked by :func:`kit.engine.decode.sampling.max_tokens`. ``on_large`` is called (before
        any check can raise) for a prompt text of :data:`kit.engine.cache.reclaim.LARGE_BYTES`
        or more, so the caller gives memory back even when the prompt is rejected.

        Raises:
            InvalidRequest: the template rejects the messages; ``context_length_exceeded``;
                a token id outside the vocabulary; text that is not valid Unicode; images
                or audio for a model that reads text only.
        """
        if (request.images or request.audio) and not self.slot.vision:
            kind = "image" if request.images else "audio"
            raise InvalidRequest(f"{kind} content is not supported by this text-only model",
                                 code="unsupported_content", field="messages")
        if request.prompt_ids is not None:  # token ids (legacy completions)
            vocab = self.slot.vocab_size()
            bad = next((t for t in request.prompt_ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequest(f"prompt: token id {bad} is not in this model's "
                                     f"vocabulary (0..{vocab - 1})", code="invalid_value",
                                     field="prompt")
            return list(request.prompt_ids), None

        if request.prompt is not None:
            text = request.prompt
        else:
            try:
                text = self.render_text(request, request.messages, generation_prompt=True)
            except InvalidRequest:
                raise
            except Exception as e:
                # Anything the template raises on a request is about the request
                # (OverflowError from the sandbox's range limit, RecursionError, a
                # SecurityError...): a 400 with a short excerpt, never a 500.
                raise InvalidRequest("the model's chat template rejected the messages: "
                                     f"{excerpt(str(e) or type(e).__name__, 200)}") from None
        if on_large is not None and len(text) >= LARGE_BYTES:
            on_large()
        bound = self.slot.bound()
        if bound is not None:
            room = self.slot.info.context_window - (max_tokens or 1)
            at_least = bound.at_least(text, above=room)
            if at_least > room:
                budget(self.slot.info, at_least, max_tokens, at_least=True)  # raises
        try:
            if request.prompt is not None:
                tokens = list(self.slot.tokenizer.encode(text))
                if not tokens:  # mlx-lm cannot start from nothing
                    raise InvalidRequest("the prompt has no tokens", field="prompt")
                return tokens, None
            if self.slot.vision:
                return vision.inputs(self.slot, request, text)
            return self.encode_rendered(text), None
        except (TypeError, ValueError) as e:  # the tokenizer takes valid Unicode only
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequest("the prompt is not valid Unicode (it contains a lone "
                                     "UTF-16 surrogate)", field="prompt" if request.prompt
                                     is not None else "messages") from None
            raise InvalidRequest(f"the prompt cannot be tokenized: {excerpt(str(e))}",
                                 field="prompt" if request.prompt is not None
                                 else "messages") from None

    def render_text(self, request: ChatRequest, messages: list[dict[str, Any]], *,
                    generation_prompt: bool) -> str:
        """``messages`` through the chat template with ``request``'s tools and template
        variables, as text (raises whatever the template raises).

        Raises:
            InvalidRequest: a template variable names an argument of the renderer itself
                (``chat_template``, ``messages``, ``tokenize``...; the HTTP schemas refuse
                them first, this guards every caller of the engine).
        """
        tokenizer = self.slot.tokenizer
        reserved = reserved_template_keys(tokenizer)
        bad = next((k for k in request.template_kwargs if k in reserved), None)
        if bad is not None:
            raise InvalidRequest(f"chat_template_kwargs.{excerpt(str(bad), 60)} is set by the "
                                 "server, not by a request", code="invalid_value",
                                 field=f"template_kwargs.{excerpt(str(bad), 60)}")
        kwargs: dict[str, Any] = {**request.template_kwargs,
                                  "add_generation_prompt": generation_prompt,
                                  "tokenize": False, "return_dict": False}
        effort, fmt = kwargs.get("reasoning_effort"), self.slot.output_format
        if isinstance(effort, str) and fmt is not None:  # the levels its template knows
            kwargs["reasoning_effort"] = fmt.template_effort(effort)
        if request.tools:
            kwargs["tools"] = request.tools
        text = tokenizer.apply_chat_template(messages, **kwargs)
        if not isinstance(text, str):  # a template variable changed it
            raise ValueError("the chat template did not return text")
        return text

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt, as ``apply_chat_template(tokenize=True)``
        makes them (the template writes the special tokens itself)."""
        return list(mlx_lm_api.hf_tokenizer(self.slot.tokenizer).encode(text, add_special_tokens=False))

    def render(self, request: ChatRequest, messages: list[dict[str, Any]], *,
               generation_prompt: bool) -> list[int]:
        """:meth:`render_text`, as token ids."""
        return self.encode_rendered(self.render_text(request, messages,
                                                     generation_prompt=generation_prompt))

    def tail_text(self, prompt: list[int], n: int = 32) -> str:
        """The text of the prompt's last ``n`` tokens, special tokens included: what the
        output parser reads to tell whether the prompt opened a think block."""
        return self.slot.tokenizer.decode(prompt[-n:])

    def opens_reasoning(self, prompt: list[int]) -> bool:
        """The prompt ends inside a think block it opened (a thinking template's
        generation prompt)."""
        think = self.slot.output_format.think
        if not think:
            return False
        tail = self.tail_text(prompt)
        return tail.rfind(think[0]) > tail.rfind(think[1])

    def constraint(self, request: ChatRequest,
                   prompt: list[int]) -> tuple[str | None, list[int], str]:
        """The grammar a request's output must follow (None: free), the tokens to append to
        its prompt, and the request field the grammar comes from (for errors); see
        :mod:`kit.engine.decode.grammar`. A constrained answer skips the model's reasoning: a
        think block the prompt left open is closed first, so what the grammar makes is the
        answer (or the call), not reasoning.

        Raises:
            InvalidRequest: a tool's parameters or the response schema are not JSON
                schema objects (``field`` ``tools`` or ``schema``).
        """
        tok, fmt = self.slot.tokenizer, self.slot.output_format
        close: list[int] = []
        if fmt.think and self.opens_reasoning(prompt):
            close = list(tok.encode(fmt.think[1], add_special_tokens=False))
        try:
            if request.force_tool is not None and request.tools and fmt.tools:
                tools = request.tools if not request.force_tool else [
                    t for t in request.tools
                    if (t.get("function") or {}).get("name") == request.force_tool]
                start = list(tok.encode(fmt.tool[0], add_special_tokens=False))
                grammar = tool_call_grammar(fmt.grammar, tools,
                                            parallel=request.parallel_tool_calls)
                return grammar, close + start, "tools"
            if request.response_schema is not None and not request.raw:
                return json_grammar(request.response_schema), close, "schema"
        except ValueError as e:
            raise InvalidRequest(str(e), field="tools" if request.force_tool is not None
                                 else "schema") from None
        return None, [], ""
