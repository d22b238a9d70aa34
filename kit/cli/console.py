"""Rich consoles shared by the commands: ``console`` (stdout) and ``err_console`` (stderr)."""

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
