"""Options shared by several commands."""

from enum import Enum

import typer

from kit.urls import DEFAULT_URL, URL_ENV

URL = typer.Option(None, "--url", envvar=URL_ENV, show_default=DEFAULT_URL,
                   help=f"Server URL, with or without /v1 (env {URL_ENV}).")

TRUST_REMOTE_CODE = typer.Option(
    False, "--trust-remote-code",
    help="Let a model run Python code shipped in its folder when it loads (a tokenizer named "
         "by auto_map, e.g. Kimi's; an architecture named by model_file). Off by default: "
         "that code runs with your user's rights, so pass it only for models you trust.")


def disk_size(text: str) -> int:
    """``--prompt-cache-disk`` (serve, launch) in bytes ("0": no disk tier).

    Raises:
        ConfigError: not a size.
    """
    from kit.errors import ConfigError
    from kit.models.memory import parse_size

    try:
        return parse_size(text)
    except ConfigError as e:
        raise ConfigError(f"--prompt-cache-disk: {e.message}",
                          hint="e.g. 10GiB, or 0 for none") from None


def check_cache_dir(folder: str | None, disk_bytes: int) -> None:
    """Refuse a ``--prompt-cache-dir`` that another user could have put a file in (not
    this user's, or writable by group or others, it or a folder above it; as ssh's
    StrictModes). The default folder is not refused here: the engine then runs without
    the disk tier, with a warning (:class:`kit.engine.cache.disk_cache.DiskCache`).

    Raises:
        ConfigError: naming the folder and why.
    """
    from pathlib import Path

    from kit.engine.cache.safe_files import not_private
    from kit.errors import ConfigError

    if folder is None or disk_bytes <= 0:
        return
    problem = not_private(Path(folder).expanduser())
    if problem:
        raise ConfigError(
            f"refusing --prompt-cache-dir {folder}: {problem}; another user could plant a "
            "cache file there and have your prompts answered from it",
            hint="use a folder only you can write (chmod go-w, or 0700), or leave the flag "
                 "out for the default one")


class WarmUp(str, Enum):
    """``--warmup``'s choices (see kit/engine/decode/warmup.py)."""

    auto = "auto"
    on = "on"
    off = "off"


WARMUP = typer.Option(
    WarmUp.auto, "--warmup", case_sensitive=False,
    help="Run the shapes of a first request and the first batches before the server says "
         "ready, so mlx compiles their kernels then (kept per machine in the kernel cache). "
         "auto: only where mlx runs on CUDA; on; off (not even one tiny generation).")
