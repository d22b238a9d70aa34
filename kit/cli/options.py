"""Options shared by several commands."""

import typer

from kit.urls import DEFAULT_URL, URL_ENV

URL = typer.Option(None, "--url", envvar=URL_ENV, show_default=DEFAULT_URL,
                   help=f"Server URL, with or without /v1 (env {URL_ENV}).")
