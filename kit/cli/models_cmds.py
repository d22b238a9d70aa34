"""``mlx-kit models``, ``swap``, ``fit``, ``pull``: the models on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from kit.cli.config_options import takes_config
from kit.cli.console import console, err_console
from kit.cli.options import URL
from kit.cli.output import JSON, emit_json, print_table
from kit.errors import ConfigError, ExitCode, ModelError

if TYPE_CHECKING:
    from kit.config import EngineConfig
    from kit.health import HealthBody


def models(
    as_json: bool = JSON,
    url: Optional[str] = URL,
) -> None:
    """List the models mlx-kit can serve (HF cache + starter); * marks the one behind local.

    \b
    --json: {"local": the id behind 'local' or null, "models": [{"id", "path",
    "size_bytes", "quantization", "context_window", "capabilities", "model_type",
    "loadable", "reason", "note", "local"}]}.
    """
    from kit.models.catalog import describe, scan
    from kit.models.memory import human
    from kit.probe import probe
    from kit.urls import parse_url

    p = probe(parse_url(url), timeout=1.0)
    local = p.health.model if p.kind == "ours" and p.health else None
    entries = scan()
    if local and all(e.id != local for e in entries) and Path(local).is_dir():
        # a server on a model folder (`serve --model ./dir`): not in the HF cache scan, yet
        # it is the model behind `local`, and its formats are what a user checks here
        entries.insert(0, describe(local, Path(local)))
    if as_json:
        emit_json({"local": local, "models": [
            {**e.to_json(), "local": e.id == local} for e in entries]})
        return
    rows = []
    for e in entries:
        caps = e.capabilities
        status = ("ok" if e.loadable else f"not servable: {e.reason}") + (
            f" ({e.note})" if e.note else "")
        rows.append(("*" if e.id == local else "", e.id,
                     human(e.size_bytes) if e.size_bytes else "-", e.quantization or "-",
                     str(e.context_window or "-"), "yes" if caps.tools else "no",
                     "yes" if caps.reasoning else "no", "yes" if caps.vision else "no",
                     status))
    print_table(("", "model", "size", "quantization", "context", "tools", "reasoning",
                 "vision", "status"), rows)
    console.print("* = behind 'local' on " + (parse_url(url).root if local else
                                                 "(no server running)"))


def swap(
    model: str = typer.Argument(..., help="Cache id (ORG/NAME) or model folder."),
    url: Optional[str] = URL,
    as_json: bool = JSON,
) -> None:
    """Make MODEL the model behind 'local' on the running server (no agent config changes).

    `swap local` changes nothing ('local' always names the loaded model). Exit 3 when no
    server runs at the URL.

    \b
    --json: the admin API's answer {"model", "previous", "load_seconds", "changed"}.
    """
    from kit import STABLE_MODEL_ID
    from kit.daemon import admin_swap
    from kit.probe import probe
    from kit.urls import parse_url

    u = parse_url(url)
    health = _running_server(u, probe(u))
    if model == STABLE_MODEL_ID:  # the alias of what is loaded: nothing to swap
        result = {"model": health.model, "previous": health.model,
                  "load_seconds": 0.0, "changed": False}
    else:
        with err_console.status(f"loading {model} on {u.root}"):
            result = admin_swap(u, model)
    if as_json:
        emit_json(result)
    elif result.get("changed"):
        console.print(f"local -> {result['model']} (was {result['previous']}; "
                      f"loaded in {result['load_seconds']:.2f} s)")
    else:
        console.print(f"local -> {result['model']} (already loaded)", markup=False)


def _running_server(u, p) -> HealthBody:
    """/health's body (:class:`kit.health.HealthBody`) of the mlx-kit server the probe
    ``p`` of URL ``u`` found.

    Raises:
        ServerNotRunningError: nothing answers there (exit 3).
        PortInUseError: something that is not mlx-kit answers.
    """
    from kit.errors import PortInUseError, ServerNotRunningError

    if p.kind == "none":
        raise ServerNotRunningError(f"no mlx-kit server is running on {u.root}",
                                    hint="start one with `mlx-kit serve` (or `mlx-kit "
                                         "launch AGENT`), or pass --url")
    if p.kind == "other":
        raise PortInUseError(f"{u.root} answers but is not mlx-kit ({p.detail})")
    return p.health


@takes_config("fit")
def fit(
    model: str = typer.Argument(..., help="Cache id (ORG/NAME) or model folder."),
    ctx: Optional[int] = typer.Option(None, "--ctx", min=1, help="Context tokens (default: "
                                      "the model's context window)."),
    as_json: bool = JSON,
    *,
    config: EngineConfig,
) -> None:
    """Estimate the memory MODEL needs (weights + KV cache) against the memory ceiling
    (--memory-budget; else on a Mac, Metal's GPU working set; else what is available now);
    also the context each KV setting (full precision, 8 and 4 bits) leaves room for; with
    --ranks/--hosts, each rank's share of the model split over mx.distributed ranks; with
    --draft-model, its draft's weights and KV cache counted in (loaded beside it).

    Exit 0 when it loads, 5 when it does not. Sizes are binary (1 GiB = 2^30 bytes).

    \b
    --json: {"model", "context_window", "weights_bytes", "kv_bytes",
    "kv_bytes_per_token", "total_bytes", "ceiling_bytes", "ceiling_source",
    "context_that_fits", "kv_bits", "kv_group_size", "kv_settings" [{"kv_bits",
    "kv_bytes_per_token", "context_that_fits"}], "fits", "draft" (null, or {"model",
    "weights_bytes", "kv_bytes_per_token"}: included in the sums)}; with --ranks or --hosts also
    "ranks", "mode", "per_rank" [{"rank", "layers", "weights_bytes", "kv_bytes",
    "total_bytes"}], "this_machine_bytes" (what "fits" compares with "ceiling_bytes",
    which --memory-budget sets here too) and "unchecked_hosts"; without
    "kv_bytes_per_token", "context_that_fits" and the kv keys.
    """
    from kit.models.memory import (Estimate, context_that_fits, estimate, fit_context, human,
                                   memory_ceiling)
    from kit.models.resolve import resolve_model

    ranks, hosts, pipeline = config.ranks, config.hosts, config.pipeline
    kv_bits, kv_group_size, budget = config.kv_bits, config.kv_group_size, config.memory_budget
    if ranks is None and hosts is None and not pipeline:
        info = resolve_model(model, progress=lambda line: err_console.print(line))
        est = estimate(info.path, ctx or info.context_window, kv_bits, kv_group_size)
        draft = _draft_of(info, config, est.context)
        if draft is not None:
            est = Estimate(est.weights + draft[1].weights,
                           est.kv_per_token + draft[1].kv_per_token, est.context)
        ceiling = _less_embedding(memory_ceiling(budget), config.embed_model)
        room = context_that_fits(ceiling.bytes, est.weights, est.kv_per_token)
        # without --ctx the server loads a model whose first FIT_MIN_CONTEXT tokens fit
        # (memory admission caps longer requests); --ctx N asks about N tokens exactly
        needed = est.context if ctx or room is None else fit_context(est.context)
        loads = room is None and est.total <= ceiling.bytes or room is not None and \
            room >= needed
        if as_json:
            emit_json({"model": info.id, "context_window": est.context,
                       "weights_bytes": est.weights, "kv_bytes": est.kv,
                       "kv_bytes_per_token": est.kv_per_token, "total_bytes": est.total,
                       "ceiling_bytes": ceiling.bytes, "ceiling_source": ceiling.source,
                       "context_that_fits": room, "kv_bits": kv_bits,
                       "kv_group_size": kv_group_size,
                       "kv_settings": _kv_rows(info, ceiling.bytes, kv_group_size, draft),
                       "fits": loads,
                       "draft": None if draft is None else {
                           "model": draft[0].id, "weights_bytes": draft[1].weights,
                           "kv_bytes_per_token": draft[1].kv_per_token}})
        else:
            kv = f"{kv_bits}-bit" if kv_bits else "full precision"
            verdict = ("fits" if est.total <= ceiling.bytes else
                       f"fits {room} tokens of context (requests past it are capped)"
                       if loads else "does NOT fit")
            with_draft = f" (with the draft {draft[0].id})" if draft else ""
            console.print(f"{info.id}{with_draft}\n  weights:  {human(est.weights)}\n"
                          f"  KV cache: {human(est.kv)} ({kv}: {est.kv_per_token} bytes/token x "
                          f"{est.context} tokens)\n  total:    {human(est.total)}\n"
                          f"  ceiling:  {ceiling.label} -> {verdict}",
                          markup=False, highlight=False)
            console.print(_kv_windows(info, _kv_rows(info, ceiling.bytes, kv_group_size,
                                                     draft), ceiling.bytes),
                          markup=False, highlight=False)
        if not loads:
            raise typer.Exit(ExitCode.DOES_NOT_FIT)
        return
    _fit_split(model, ctx, ranks, hosts, pipeline, as_json, budget, config.embed_model)


def _draft_of(info, config: EngineConfig, context: int):
    """``(draft ModelInfo, its Estimate for context tokens)`` of ``info``'s
    ``--draft-model`` pairing (:func:`kit.engine.decode.draft.parse_pairings`), or None."""
    from kit.engine.decode.draft import parse_pairings
    from kit.models.memory import estimate
    from kit.models.resolve import resolve_model

    spec = parse_pairings(config.draft_model, info.id).get(info.id)
    if spec is None:
        return None
    try:
        draft = resolve_model(spec, progress=lambda line: err_console.print(line))
    except ModelError as e:
        raise ConfigError(f"--draft-model {spec}: {e.message}", hint=e.hint) from None
    return draft, estimate(draft.path, context, config.kv_bits, config.kv_group_size)


def _kv_rows(info, ceiling: int, group_size: int, draft=None) -> list[dict]:
    """The context each KV setting (full precision, 8 and 4 bits) leaves room for in
    ``ceiling`` bytes after the weights (and ``draft``'s, from :func:`_draft_of`):
    ``[{"kv_bits", "kv_bytes_per_token", "context_that_fits"}]`` (tokens, not capped at
    the model's window)."""
    from kit.models.memory import Estimate, estimate

    rows = []
    for bits in (None, 8, 4):
        est = estimate(info.path, 0, bits, group_size)
        if draft is not None:
            d = estimate(draft[0].path, 0, bits, group_size)
            est = Estimate(est.weights + d.weights, est.kv_per_token + d.kv_per_token, 0)
        rows.append({"kv_bits": bits, "kv_bytes_per_token": est.kv_per_token,
                     "context_that_fits": max(0, ceiling - est.weights)
                     // max(1, est.kv_per_token)})
    return rows


def _kv_windows(info, rows: list[dict], ceiling: int) -> str:
    """:func:`_kv_rows` as ``fit``'s table."""
    from kit.models.memory import human

    lines = [f"  context that fits in {human(ceiling)} after the weights (the model's window: "
             f"{info.context_window} tokens):",
             f"  {'KV cache':<16}{'per token':>11}{'tokens':>14}"]
    for row in rows:
        bits, room = row["kv_bits"], row["context_that_fits"]
        flag = f"--kv-bits {bits}" if bits else "full precision"
        lines.append(f"  {flag:<16}{human(row['kv_bytes_per_token']):>11}{room:>14}"
                     + ("  (over the window)" if room >= info.context_window else ""))
    return "\n".join(lines)


def _fit_split(model: str, ctx: int | None, ranks: int | None, hosts: str | None,
               pipeline: bool, as_json: bool = False, budget: int | None = None,
               embed_model: str | None = None) -> None:
    """``fit --ranks/--hosts``: the split's mode, a per-rank table and whether the ranks
    placed on this machine fit its memory ceiling (``budget`` bytes, ``--memory-budget``,
    else the machine's: :func:`kit.models.memory.memory_ceiling`, less ``embed_model``'s
    weights); other hosts' memory is not checked."""
    from kit.models.memory import human, memory_ceiling
    from kit.models.resolve import resolve_model
    from kit.models.split import parse_hosts, plan_split

    if ranks is None and hosts is None:
        raise ConfigError("--pipeline needs --ranks N or --hosts H1,H2",
                          hint="e.g. --ranks 2 --pipeline")
    host_list = parse_hosts(hosts) if hosts is not None else None
    n = ranks if ranks is not None else len(host_list) if host_list else 1
    if host_list and n % len(host_list):
        raise ConfigError(f"--ranks {n} is not a multiple of the {len(host_list)} hosts",
                          hint="each host runs --ranks / hosts ranks")
    info = resolve_model(model, progress=lambda line: err_console.print(line))
    plan = plan_split(info.path, n, pipeline, ctx or info.context_window)
    mode = "pipeline (layers split)" if plan.mode == "pipeline" else "tensor parallel"
    lines = [f"{info.id} over {plan.ranks} rank{'s' if plan.ranks > 1 else ''}: {mode}, "
             f"KV cache for {plan.context} tokens",
             f"  {'rank':>4}  {'layers':>9}  {'weights':>10}  {'KV cache':>10}  {'total':>10}"]
    for s in plan.per_rank:
        start, end = s.layers
        layers = f"{start}-{end - 1}" if end > start else "-"
        lines.append(f"  {s.rank:>4}  {layers:>9}  {human(s.weights_bytes):>10}  "
                     f"{human(s.kv_bytes):>10}  {human(s.total_bytes):>10}")
    hosts_n = len(host_list) if host_list else 1
    here = plan.bytes_on_host(0, hosts_n)
    per_host = plan.ranks // hosts_n
    where = (f"ranks 0-{per_host - 1}" if per_host > 1 else "rank 0") + " on this machine"
    ceiling = _less_embedding(memory_ceiling(budget), embed_model)
    avail = ceiling.bytes
    lines.append(f"  largest share: {human(plan.largest.total_bytes)} (rank "
                 f"{plan.largest.rank})")
    lines.append(f"  {where}: {human(here)}; ceiling: {ceiling.label} -> "
                 + ("fits" if here <= avail else "does NOT fit"))
    if host_list and len(host_list) > 1:
        lines.append(f"  the other hosts' memory is not checked ({', '.join(host_list[1:])})")
    if as_json:
        emit_json({"model": info.id, "context_window": plan.context, "ranks": plan.ranks,
                   "mode": plan.mode, "per_rank": [
                       {"rank": s.rank, "layers": list(s.layers),
                        "weights_bytes": s.weights_bytes, "kv_bytes": s.kv_bytes,
                        "total_bytes": s.total_bytes} for s in plan.per_rank],
                   "this_machine_bytes": here, "ceiling_bytes": ceiling.bytes,
                   "ceiling_source": ceiling.source, "fits": here <= avail,
                   "unchecked_hosts": host_list[1:] if host_list else []})
    else:
        console.print("\n".join(lines), markup=False, highlight=False)
    if here > avail:
        raise typer.Exit(ExitCode.DOES_NOT_FIT)


def _less_embedding(ceiling: Any, spec: str | None) -> Any:
    """``ceiling`` (a :class:`kit.models.memory.Ceiling`) less the weights of the embedding
    model ``spec`` (``--embed-model``), which a server loads beside the chat model."""
    if not spec:
        return ceiling
    from kit.models.memory import Ceiling, human, weights_bytes
    from kit.models.resolve import resolve_model

    used = weights_bytes(resolve_model(spec).path)
    err_console.print(f"the embedding model {spec} takes {human(used)} of the ceiling")
    return Ceiling(max(0, ceiling.bytes - used), ceiling.source)


def pull(repo_id: str = typer.Argument(..., help="ORG/NAME on the Hugging Face hub."),
         as_json: bool = JSON) -> None:
    """Download a model into the Hugging Face cache (resumable). Progress goes to stderr.

    \b
    --json: the model as `models --json` lists it ({"id", "path", "loadable",
    "reason", ...}).
    """
    from kit.models.catalog import describe
    from kit.models.pull import pull as do_pull

    path = do_pull(repo_id, progress=lambda line: err_console.print(line, markup=False))
    entry = describe(repo_id, path)
    if as_json:
        emit_json(entry.to_json())
    else:
        console.print(f"{repo_id}: {path}", markup=False)
    if not entry.loadable:
        err_console.print(f"[yellow]warning:[/] mlx-kit cannot serve it: {entry.reason}")
