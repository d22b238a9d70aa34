"""Claude Code's terminal UI (the real binary in tmux, as a user types into it) on the
starter's 8,192-token window, through `mlx-kit launch claude`: a new user's first-run
screens, then two questions. With the generated settings (docs/agents/claude.md) its own
estimate of its full prompt (~4,300 starter tokens) neither refuses the first message
("Context limit reached", as before those settings) nor compacts, and the second turn is
served from the prompt cache. Needs tmux (skipped without it, failed under
MLX_KIT_REQUIRE_AGENTS)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import REPO
from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import clean_env, require_binary

GENERATION = re.compile(r"prompt (\d+) tokens \((\d+) cached\)")
REFUSALS = re.compile(r"Context limit reached|Prompt is too long|Compacting", re.IGNORECASE)


class Pane:
    """A command on a 160x50 terminal: a tmux server of its own (``-L``), started with
    ``env``, so the command gets exactly that environment."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.tmux = ["tmux", "-L", f"mlx-kit-test-{uuid.uuid4().hex[:8]}"]
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "160", "-y", "50", command],
                       env=env, check=True)

    def text(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-S", "-200"],
                              capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        for key in keys:
            subprocess.run([*self.tmux, "send-keys", key], check=True)
            time.sleep(0.3)  # the UI reads keys one render at a time

    def wait(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if REFUSALS.search(text):
                raise AssertionError(f"Claude Code refused or compacted:\n{text}")
            if re.search(pattern, text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout:g} s:\n{self.text()}")

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def test_claude_code_interactive_answers_two_turns_on_the_starter_window(server, tmp_path):
    require_binary("claude")
    if shutil.which("tmux") is None:
        if os.environ.get("MLX_KIT_REQUIRE_AGENTS"):
            pytest.fail("tmux is not installed (MLX_KIT_REQUIRE_AGENTS is set)")
        pytest.skip("tmux is not installed")
    project = tmp_path / "project"
    project.mkdir()
    env = clean_env(tmp_path)  # the shared server needs no key
    out = tmp_path / "launch.err"
    command = (f"cd {shlex.quote(str(project))} && {shlex.quote(sys.executable)} -m kit "
               f"launch claude --url {server.v1} 2>{shlex.quote(str(out))}; sleep 30")
    log_start = len(server.log_text())
    pane = Pane(command, {**env, "PYTHONPATH": str(REPO)})
    try:
        # A new user's first run: the theme, the security notes, trusting the folder.
        pane.wait(r"Choose the text style", 120)
        pane.keys("Enter")
        pane.wait(r"Press Enter to continue", 30)
        pane.keys("Enter")
        pane.wait(r"trust this folder", 30)
        pane.keys("Down", "Enter")
        pane.wait(r"auto mode on|shift\+tab", 60)
        pane.keys("What is the capital of France?", "Enter")
        pane.wait(r"(?s)capital of France\?.*\n● ", 400)  # an answer line under the question
        middle = len(server.log_text())
        pane.keys("And of Germany?", "Enter")
        pane.wait(r"(?s)And of Germany\?.*\n● ", 120)
        screen = pane.text()
    finally:
        pane.close()
    first = [tuple(map(int, m)) for m in GENERATION.findall(server.log_text()[log_start:middle])]
    second = [tuple(map(int, m)) for m in GENERATION.findall(server.log_text()[middle:])]
    assert first and second, (first, second, screen)
    (prompt1, _), (prompt2, cached) = max(first), max(second)
    assert prompt1 > 3000 and prompt2 > prompt1  # its full prompt, then the conversation
    assert cached >= prompt1, f"turn 2 reused {cached} of turn 1's {prompt1} tokens"
    assert_no_config_warnings("claude", screen, out.read_text())
