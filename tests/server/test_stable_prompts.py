"""Qwen Code's date reminder, put back where an uninterrupted session has it
(kit/server/stable_prompts.py). The texts are Qwen Code 0.24.4's, as a relay recorded them
from `qwen -p` then `qwen -c -p` (the real run is tests/e2e/test_qwen.py)."""

from __future__ import annotations

from kit.server.stable_prompts import stable_messages

DAY = "Saturday, December 5, 2026"
SKILLS = ("<system-reminder>\nNo skills are currently available. Skills can be added by "
          "creating directories with SKILL.md files or by configuring MCP servers with "
          "model-invocable prompts.\n</system-reminder>")


def startup(day: str = DAY) -> str:
    return ("<system-reminder>\nThis is the Qwen Code. We are setting up the context for our "
            f"chat.\nToday's date is {day}.\nMy operating system is: linux\nI'm currently "
            "working in the directory: /p\n</system-reminder>")


def reminder(day: str = DAY) -> str:
    return ("<system-reminder>\nThe current date is: " + day + ". Note: This is the "
            "authoritative current date \u2014 it may differ from the \"Today's date\" "
            "mentioned earlier in the conversation startup context.\n</system-reminder>")


def conversation(first: str, *later: str) -> list[dict]:
    """A system message, then user/assistant turns (``later``: the later questions)."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": first}]
    for i, question in enumerate(later):
        msgs += [{"role": "assistant", "content": f"answer {i}"},
                 {"role": "user", "content": question}]
    return msgs


def test_a_resumed_qwen_session_renders_as_the_uninterrupted_one():
    first_process = conversation(SKILLS + startup() + reminder() + "Capital of France?")
    resumed = conversation(SKILLS + startup() + "Capital of France?",
                           reminder() + "And of Germany?")
    uninterrupted = conversation(SKILLS + startup() + reminder() + "Capital of France?",
                                 "And of Germany?")
    out = stable_messages(resumed)
    assert out == uninterrupted
    assert out[:2] == first_process[:2]  # the first process's prompt is a prefix: cached
    assert resumed[3]["content"] == reminder() + "And of Germany?"  # the request's own list


def test_a_third_resumed_turn_keeps_the_prefix_of_the_second():
    second = stable_messages(conversation(SKILLS + startup() + "Q1", reminder() + "Q2"))
    third = stable_messages(conversation(SKILLS + startup() + "Q1", "Q2", reminder() + "Q3"))
    assert third[:4] == second[:4] and third[5]["content"] == "Q3"


def test_on_another_day_the_reminder_stays_with_the_new_question():
    """The date really changed: the model must see it at the question that is today's."""
    msgs = conversation(SKILLS + startup("Friday, December 4, 2026") + "Q1", reminder() + "Q2")
    assert stable_messages(msgs) is msgs


def test_anything_else_is_left_as_sent():
    cases = [
        conversation(SKILLS + startup() + reminder() + "Q1", "Q2"),  # in one process
        conversation(startup() + reminder() + "Q1", reminder() + "Q2"),  # two reminders
        conversation("Q1 without Qwen's startup context", reminder() + "Q2"),
        conversation(SKILLS + startup() + reminder() + "Q1"),  # a first turn
        conversation(SKILLS + startup() + "Q1", reminder().replace("authoritative", "") + "Q2"),
    ]
    for msgs in cases:
        assert stable_messages(msgs) is msgs
