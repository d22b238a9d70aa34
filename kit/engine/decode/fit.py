"""The fit check a model load runs first: the estimate of its weights and KV cache (this
rank's share on a distributed engine; its draft model's added) against the memory
ceiling (:mod:`kit.models.memory`)."""

from __future__ import annotations

import logging
from typing import Any

from kit.errors import ModelDoesNotFitError
from kit.models.memory import Estimate, estimate, fit_context, human, memory_ceiling
from kit.models.resolve import ModelInfo
from kit.models.split import plan_split

log = logging.getLogger("mlx_kit.engine")


def check_fit(slot: Any, info: ModelInfo, replacing: int) -> tuple[int, Any, int]:
    """``(weights, ceiling, kv_per_token)`` of ``info`` for ``slot`` (a
    :class:`kit.engine.decode.slot.ModelSlot`: its split, KV settings, draft pairings and
    memory budget): the estimated weights in bytes, the
    :class:`kit.models.memory.Ceiling` checked against and the KV cache bytes per token;
    ``(0, None, 0)`` without an estimate, which is allowed.

    Raises:
        ModelDoesNotFitError: weights + KV cache for the first
            :data:`~kit.models.memory.FIT_MIN_CONTEXT` tokens of its window (its
            whole window on a distributed rank, where memory admission is off)
            exceed the ceiling (:func:`kit.models.memory.memory_ceiling`: the budget,
            Metal's working set, or the memory available).
    """
    here = ""
    try:
        if slot.split is None:  # admission caps requests past this: see fit_context
            est = estimate(info.path, fit_context(info.context_window),
                           kv_bits=slot.kv_bits, kv_group_size=slot.kv_group_size)
        else:  # SplitError (a ModelError): the model cannot be split this way

            rank, size, pipeline, beside = slot.split
            share = plan_split(info.path, size, pipeline,
                               info.context_window).per_rank[rank]
            est = Estimate(share.weights_bytes, share.kv_bytes // max(1, info.context_window)
                           if info.context_window else 0, info.context_window)
            here = f" for rank {rank}'s share of {size}"
            if beside > 1:  # the ranks on one machine share its memory
                est = Estimate(est.weights * beside, est.kv_per_token * beside, est.context)
                here = f" for the {beside} ranks on this machine ({size} in all)"
    except (OSError, ValueError, KeyError) as e:
        log.warning("cannot estimate the memory of %s: %s", info.id, e)
        return 0, None, 0
    draft = slot.drafts.estimate(info, est.context, slot.kv_bits, slot.kv_group_size) \
        if slot.drafts is not None else None
    if draft is not None:  # loaded beside it: its weights and its KV per token
        draft_info, extra = draft
        est = Estimate(est.weights + extra.weights, est.kv_per_token + extra.kv_per_token,
                       est.context)
        here = f" with its draft model {draft_info.id}"
    ceiling = memory_ceiling(slot.memory_budget, replacing)
    budget = ceiling.bytes
    if est.total > budget:
        raise ModelDoesNotFitError(
            f"{info.id} does not fit{here}: it needs ~{human(est.total)} "
            f"({human(est.weights)} weights + {human(est.kv)} KV cache for {est.context} "
            f"tokens) but the ceiling is {ceiling.label}",
            hint="free memory, pick a smaller or more quantized model, or raise "
                 "--memory-budget", needed=est.total, budget=budget)
    if slot.split is not None and slot.split[3] > 1:
        return est.weights // slot.split[3], ceiling, est.kv_per_token
    return est.weights, ceiling, est.kv_per_token
