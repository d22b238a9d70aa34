"""Fail an end-to-end test when the agent complains about the config mlx-kit wrote.

An agent that answers can still print that it ignored a key, does not know the model or
guessed its context window: the user sees that line on every run, and a test that only
checks the answer misses it. ``assert_no_config_warnings(agent, r.stdout, r.stderr)``
scans both streams for such lines and fails naming them.

A line is a complaint when it matches ``COMPLAINT`` (unknown / unrecognized / ignored /
deprecated / invalid key or model, an assumed or fallback context window or metadata,
"warning"/"error" prefixes). Some agents print lines that match but are not about our
config (the test machine has no bubblewrap, HOME lives under /tmp); those are listed per
agent in ``KNOWN``, each with the reason, so nothing is allowed silently.
"""

from __future__ import annotations

import re

#: What a complaint about the config looks like (case-insensitive, per line).
COMPLAINT = re.compile(
    r"\b(unknown|unrecogni[sz]ed|not recogni[sz]ed|doesn't recognize|does not recognize|"
    r"ignored|ignoring|deprecated|invalid|unsupported|not supported|not found|"
    r"assumes a context window|fallback metadata|could not parse|failed to parse)\b"
    r"|^\s*(warn(ing)?|error)\b[:\]]?",
    re.IGNORECASE | re.MULTILINE)

#: Lines that match COMPLAINT but are not about our config: agent -> [(pattern, why)].
KNOWN: dict[str, list[tuple[str, str]]] = {
    "codex": [
        (r"could not create PATH aliases: Refusing to create helper binaries under "
         r"temporary dir", "the test's HOME is under /tmp; a user's is not"),
        (r"could not find bubblewrap on PATH", "this machine has no bubblewrap; Codex "
         "uses its bundled copy"),
    ],
    "aider": [
        (r"^Warning: Input is not a terminal \(fd=0\)\.$", "the test runs aider with stdin "
         "from /dev/null"),
    ],
    "cline": [
        # Cline 3.0.65's request code passes the AI SDK its provider options under the old
        # key; any OpenAI-compatible provider prints these two lines (not our config).
        (r"^Warning: AI SDK Warning System: To turn off warning logging, set the "
         r"AI_SDK_LOG_WARNINGS global to false\.$", "the AI SDK's banner before its notice"),
        (r"^DeprecationWarning: AI SDK Warning \(openai-compatible\.chat / local\): "
         r"Deprecated: \"providerOptions key 'openai-compatible'\"",
         "Cline's own providerOptions key, whatever the provider's settings"),
    ],
    "claude": [
        # A telemetry line Claude Code 2.1.332 prints for any id outside its catalog
        # (CLAUDE_CODE_MAX_CONTEXT_TOKENS silences the user-facing warning, not this).
        (r"^\[claude-code:unrecognized_model\] \{\"model\":\"local\"",
         "Claude Code's telemetry line for a non-catalog model id"),
    ],
}


def config_complaints(agent: str, *streams: str) -> list[str]:
    """The lines of ``streams`` that complain about config, minus ``KNOWN[agent]``.

    Args:
        agent: the harness name (``pi``, ``claude``, ``codex``, ...).
        streams: the agent's stdout and stderr (or any text it printed).

    Returns:
        The offending lines, stripped, in order.
    """
    known = [re.compile(p, re.IGNORECASE) for p, _ in KNOWN.get(agent, [])]
    found = []
    for text in streams:
        for line in (text or "").splitlines():
            if COMPLAINT.search(line) and not any(k.search(line.strip()) for k in known):
                found.append(line.strip())
    return found


def assert_no_config_warnings(agent: str, *streams: str) -> None:
    """Fail when the agent printed a complaint about its config (see module docstring)."""
    found = config_complaints(agent, *streams)
    assert not found, f"{agent} printed warnings/errors about its config:\n" + "\n".join(found)
