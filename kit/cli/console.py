"""Rich consoles shared by the commands: ``console`` (stdout) and ``err_console`` (stderr)."""

from rich.console import Console

# soft_wrap: never break lines (paths, diffs) at the terminal width; let the terminal wrap.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
