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


class WarmUp(str, Enum):
    """``--warmup``'s choices (see kit/engine/warmup.py)."""

    auto = "auto"
    on = "on"
    off = "off"


WARMUP = typer.Option(
    WarmUp.auto, "--warmup", case_sensitive=False,
    help="Run the shapes of a first request and the first batches before the server says "
         "ready, so mlx compiles their kernels then (kept per machine in the kernel cache). "
         "auto: only where mlx runs on CUDA; on; off (not even one tiny generation).")
