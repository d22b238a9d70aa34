"""``mlx-kit models``, ``swap``, ``fit``, ``pull``: the models on this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kit.cli.console import console, err_console
from kit.cli.options import URL


def models(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    url: Optional[str] = URL,
) -> None:
    """List the models mlx-kit can serve (HF cache + starter); * marks the one behind local."""
    from kit.models.catalog import describe, scan
    from kit.models.memory import human
    from kit.probe import probe
    from kit.urls import parse_url

    p = probe(parse_url(url), timeout=1.0)
    local = p.health.get("model") if p.kind == "ours" and p.health else None
    entries = scan()
    if local and all(e.id != local for e in entries) and Path(local).is_dir():
        # a server on a model folder (`serve --model ./dir`): not in the HF cache scan, yet
        # it is the model behind `local`, and its formats are what a user checks here
        entries.insert(0, describe(local, Path(local)))
    if as_json:
        console.print_json(json.dumps({"local": local, "models": [
            {**e.to_json(), "local": e.id == local} for e in entries]}))
        return
    from rich.table import Table

    table = Table("", "model", "size", "quantization", "context", "tools", "reasoning",
                  "vision", "status")
    for column in table.columns:
        column.overflow = "fold"
    for e in entries:
        caps = e.capabilities
        status = ("ok" if e.loadable else f"not servable: {e.reason}") + (
            f" ({e.note})" if e.note else "")
        table.add_row("*" if e.id == local else "", e.id,
                      human(e.size_bytes) if e.size_bytes else "-", e.quantization or "-",
                      str(e.context_window or "-"), "yes" if caps.tools else "no",
                      "yes" if caps.reasoning else "no", "yes" if caps.vision else "no", status)
    console.print(table)
    console.print("* = behind 'local' on " + (parse_url(url).root if local else
                                                 "(no server running)"))


def swap(
    model: str = typer.Argument(..., help="Cache id (ORG/NAME) or model folder."),
    url: Optional[str] = URL,
) -> None:
    """Make MODEL the model behind 'local' on the running server (no agent config changes)."""
    from kit.daemon import admin_swap
    from kit.urls import parse_url

    u = parse_url(url)
    with err_console.status(f"loading {model} on {u.root}"):
        result = admin_swap(u, model)
    if result.get("changed"):
        console.print(f"local -> {result['model']} (was {result['previous']}; "
                      f"loaded in {result['load_seconds']:.2f} s)")
    else:
        console.print(f"local -> {result['model']} (already loaded)")


def fit(
    model: str = typer.Argument(..., help="Cache id (ORG/NAME) or model folder."),
    ctx: Optional[int] = typer.Option(None, "--ctx", min=1, help="Context tokens (default: "
                                      "the model's context window)."),
    ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="Split the model over "
                                        "N ranks (mx.distributed): print each rank's share."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated hosts the "
                                        "ranks run on (the first is this machine); without "
                                        "--ranks, one rank per host."),
    pipeline: bool = typer.Option(False, "--pipeline", help="Split by layers (mlx-lm's "
                                  "pipeline mode) instead of tensor parallelism."),
    kv_bits: Optional[int] = typer.Option(None, "--kv-bits", help="Estimate with the KV "
                                          "cache quantized to 8 or 4 bits (serve --kv-bits)."),
    kv_group_size: int = typer.Option(64, "--kv-group-size", help="Its group size (32, 64, "
                                      "128)."),
) -> None:
    """Estimate the memory MODEL needs (weights + KV cache) against what is available, and
    the context each KV setting (full precision, 8 and 4 bits) leaves room for; with
    --ranks/--hosts, each rank's share of the model split over mx.distributed ranks."""
    from kit.engine.kv import check_kv
    from kit.models.memory import available_bytes, estimate, human
    from kit.models.resolve import resolve_model

    check_kv(kv_bits, kv_group_size)
    if ranks is None and hosts is None and not pipeline:
        info = resolve_model(model, progress=lambda line: err_console.print(line))
        est = estimate(info.path, ctx or info.context_window, kv_bits, kv_group_size)
        avail = available_bytes()
        kv = f"{kv_bits}-bit" if kv_bits else "full precision"
        console.print(f"{info.id}\n  weights:  {human(est.weights)}\n"
                      f"  KV cache: {human(est.kv)} ({kv}: {est.kv_per_token} bytes/token x "
                      f"{est.context} tokens)\n  total:    {human(est.total)}\n"
                      f"  available now: {human(avail)} -> "
                      + ("fits" if est.total <= avail else "does NOT fit"), highlight=False)
        console.print(_kv_windows(info, avail, kv_group_size), markup=False, highlight=False)
        if est.total > avail:
            raise typer.Exit(2)
        return
    _fit_split(model, ctx, ranks, hosts, pipeline)


def _kv_windows(info, avail: int, group_size: int) -> str:
    """The ``fit`` table of the context each KV setting leaves room for in ``avail`` bytes
    after the weights: bytes per token and tokens (capped at the model's window)."""
    from kit.models.memory import estimate, human

    lines = [f"  context that fits in {human(avail)} after the weights (the model's window: "
             f"{info.context_window} tokens):",
             f"  {'KV cache':<16}{'per token':>11}{'tokens':>14}"]
    for bits in (None, 8, 4):
        est = estimate(info.path, 0, bits, group_size)
        room = max(0, avail - est.weights) // max(1, est.kv_per_token)
        flag = f"--kv-bits {bits}" if bits else "full precision"
        lines.append(f"  {flag:<16}{human(est.kv_per_token):>11}{room:>14}"
                     + ("  (over the window)" if room >= info.context_window else ""))
    return "\n".join(lines)


def _fit_split(model: str, ctx: int | None, ranks: int | None, hosts: str | None,
               pipeline: bool) -> None:
    """``fit --ranks/--hosts``: the split's mode, a per-rank table and whether the ranks
    placed on this machine fit its memory (other hosts' memory is not checked)."""
    from kit.errors import ConfigError
    from kit.models.memory import available_bytes, human
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
             f"  {'rank':>4}  {'layers':>9}  {'weights':>9}  {'KV cache':>9}  {'total':>9}"]
    for s in plan.per_rank:
        start, end = s.layers
        layers = f"{start}-{end - 1}" if end > start else "-"
        lines.append(f"  {s.rank:>4}  {layers:>9}  {human(s.weights_bytes):>9}  "
                     f"{human(s.kv_bytes):>9}  {human(s.total_bytes):>9}")
    hosts_n = len(host_list) if host_list else 1
    here = plan.bytes_on_host(0, hosts_n)
    per_host = plan.ranks // hosts_n
    where = (f"ranks 0-{per_host - 1}" if per_host > 1 else "rank 0") + " on this machine"
    avail = available_bytes()
    lines.append(f"  largest share: {human(plan.largest.total_bytes)} (rank "
                 f"{plan.largest.rank})")
    lines.append(f"  {where}: {human(here)}; available now: {human(avail)} -> "
                 + ("fits" if here <= avail else "does NOT fit"))
    if host_list and len(host_list) > 1:
        lines.append(f"  the other hosts' memory is not checked ({', '.join(host_list[1:])})")
    console.print("\n".join(lines), markup=False, highlight=False)
    if here > avail:
        raise typer.Exit(2)


def pull(repo_id: str = typer.Argument(..., help="ORG/NAME on the Hugging Face hub.")) -> None:
    """Download a model into the Hugging Face cache (resumable)."""
    from kit.models.catalog import describe
    from kit.models.pull import pull as do_pull

    path = do_pull(repo_id, progress=lambda line: err_console.print(line))
    entry = describe(repo_id, path)
    console.print(f"{repo_id}: {path}")
    if not entry.loadable:
        err_console.print(f"[yellow]warning:[/] mlx-kit cannot serve it: {entry.reason}")
