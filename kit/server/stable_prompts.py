"""Rules that keep a known agent's prompt the same across its own processes, so that the
prompt cache reuses it: each rule recognises text one agent writes, and renders a resumed
conversation exactly as the agent's uninterrupted session would have sent it. A rule
never changes what the model is told, only where a block the agent moved sits, and only
when the result is byte for byte the uninterrupted session's prompt.

The one rule today is Qwen Code's date reminder (docs/agents/qwen.md "Resumed sessions and
the prompt cache"). Qwen adds ``<system-reminder>The current date is: DAY. ...`` to the
first question each process sends and does not save it with the session: in one process
it stays in the first question of the conversation, but ``qwen -c -p`` (a new process)
sends the history without it and adds it to the new question instead. The prompt then
departs from the cached one at the first question, and a resumed turn re-reads almost
all of the conversation (measured: 17-54 % reused). When the reminder's day is the day the
conversation's own startup context names, the rule puts it back in the first question,
where the uninterrupted session has it; on another day (the date really changed) nothing
moves.

Works on :class:`kit.engine.types.ChatRequest` messages, whose content is already
flattened to one string (a message's text parts joined with nothing between them), so it
serves every protocol alike.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("mlx_kit.server")

#: Qwen Code's date reminder, as its client writes it (@qwen-code/qwen-code 0.24.4,
#: ``formatDateForContext``); group 1 is the day.
QWEN_DATE_REMINDER = re.compile(
    r"<system-reminder>\nThe current date is: ([^\n]{1,80})\. Note: This is the "
    r"authoritative current date \u2014 it may differ from the \"Today's date\" mentioned "
    r"earlier in the conversation startup context\.\n</system-reminder>")

#: The end of Qwen Code's startup context (the first user message's environment block);
#: group 1 is the day it was written.
QWEN_STARTUP = re.compile(
    r"<system-reminder>\nThis is the Qwen Code\. We are setting up the context for our "
    r"chat\.\nToday's date is ([^\n]{1,80})\.\n.*?</system-reminder>", re.DOTALL)


def qwen_resumed_date_reminder(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Qwen Code's resumed conversation with its date reminder moved back into the first
    user message, right after the startup context, when that is where the uninterrupted
    session has it. Otherwise ``messages`` unchanged (the same list).

    Moves only when all of these hold: the request holds exactly one date reminder, in a
    user message after the first; the first user message holds Qwen's startup context and
    no reminder; both name the same day.
    """
    users = [i for i, m in enumerate(messages)
             if m.get("role") == "user" and isinstance(m.get("content"), str)]
    if len(users) < 2:
        return messages
    found = [(i, m) for i in users for m in QWEN_DATE_REMINDER.finditer(messages[i]["content"])]
    if len(found) != 1 or found[0][0] == users[0]:
        return messages
    at, reminder = found[0]
    first = messages[users[0]]["content"]
    startup = QWEN_STARTUP.search(first)
    if startup is None or startup.group(1) != reminder.group(1):
        return messages
    out = [dict(m) for m in messages]
    text = out[at]["content"]
    out[at]["content"] = text[:reminder.start()] + text[reminder.end():]
    out[users[0]]["content"] = first[:startup.end()] + reminder.group(0) + first[startup.end():]
    log.debug("stable prompt: Qwen Code's date reminder moved from message %d to message %d "
              "(a resumed session, as the uninterrupted one sends it)", at, users[0])
    return out


#: Every rule, applied in order to each chat request's messages.
RULES = (qwen_resumed_date_reminder,)


def stable_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` after every rule of :data:`RULES` (the same list when none applies)."""
    for rule in RULES:
        messages = rule(messages)
    return messages
