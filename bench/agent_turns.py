"""Benchmark: how much of each turn's prompt real agents get from the prompt cache.

Each agent (the real binary, a throwaway HOME, `mlx-kit launch AGENT --url ...`) holds a
three-turn headless conversation (a first question, then two follow-ups with the agent's
own continue/resume flag; ``{session}`` in those flags is the session id the previous turn
printed) and then starts a new session (a different first question), against one real
server on the starter (SmolLM2-135M-Instruct; greedy for requests that set no
temperature). A recording relay (tests/e2e/relay.py) stands between agent and server: it
keeps each request's body and the request id of the server's answer, which the server's
log line for that generation starts with (``<id>: ..., prompt N tokens (C cached) ...
ttft T s``), so each generation is paired with the body that asked for it.

Per turn: the generations its requests got (``req``, side requests such as titles
included), and the prompt tokens, cached tokens and TTFT of its conversation request. The
conversation request: the system prompt (the first message, or the ``system`` /
``instructions`` / ``systemInstruction`` field) shared by most of the agent's requests in
the whole run is the conversation's; of the turn's requests with it, the one with the
largest prompt (the last if several: a retry). ``reuse`` is the cached tokens over the
previous turn's conversation prompt (turns 2 and 3) or over this turn's prompt (a new
session shares only the system prompt and tools); over 100 % when the previous answer was
cached too. Goal: reuse >= 95 % on turns 2, 3 and the new session. An agent with no
headless resume (no continue args) runs turn 1 and the new session only.

Usage: python bench/agent_turns.py [--agents claude,pi,...] [--url URL --log FILE]
  [--bodies DIR] [--draft]  (agents on PATH; without --url a server is started here and stopped at
  the end; --bodies: each turn's conversation request body as DIR/AGENT-TURN.json)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

from tests.e2e.relay import Exchange, Relay  # noqa: E402
from tests.e2e.test_cline import CLINE_RUN_ENV  # noqa: E402
from tests.e2e.test_droid import DROID_EXEC  # noqa: E402
from tests.e2e.test_qwen import SLIM as QWEN_SLIM  # noqa: E402
from tests.e2e.test_qwen import project as qwen_project  # noqa: E402
from tests.e2e.test_kilo import ANSWER_AGENT as KILO_ANSWER_AGENT  # noqa: E402

#: Copilot's headless switches on the starter (tests/e2e/test_copilot.py), aider's, Droid's.
COPILOT = ["-s", "--allow-all", "--available-tools=none"]
AIDER = ["--yes-always", "--no-git", "--no-pretty", "--no-stream"]
DROID = list(DROID_EXEC)

QUESTIONS = ("What is the capital of France?", "And of Germany?", "And of Italy?")
NEW_SESSION = "What is the capital of Spain?"

#: agent -> (binary, first-turn args, continue args or None: no headless resume): ``{q}``
#: is the question, ``{session}`` the previous turn's session id (`SESSION`). Flags from
#: each agent's own --help (pinned versions: .ci/run).
AGENTS: dict[str, tuple[str, list[str], list[str] | None]] = {
    "claude": ("claude", ["-p", "{q}"], ["-c", "-p", "{q}"]),
    "pi": ("pi", ["-p", "{q}"], ["-c", "-p", "{q}"]),
    "opencode": ("opencode", ["run", "{q}"], ["run", "-c", "{q}"]),
    "codex": ("codex", ["exec", "--skip-git-repo-check", "{q}"],
              ["exec", "resume", "--last", "--skip-git-repo-check", "{q}"]),
    # Qwen's own prompt (~15,700 starter tokens) does not fit the starter's 8,192-token
    # window: slimmed by its own switches, as tests/e2e/test_qwen.py does.
    "qwen": ("qwen", [*QWEN_SLIM, "-p", "{q}"], [*QWEN_SLIM, "-c", "-p", "{q}"]),
    "gemini": ("gemini", ["--skip-trust", "-p", "{q}"],
               ["--skip-trust", "--resume", "latest", "-p", "{q}"]),
    "copilot": ("copilot", [*COPILOT, "-p", "{q}"], [*COPILOT, "--continue", "-p", "{q}"]),
    "continue": ("cn", ["-p", "{q}"], ["--resume", "-p", "{q}"]),
    # Kilo's default agent never stops on the starter: the project's one-sentence agent
    # (tests/e2e/test_kilo.py, docs/agents/kilo.md)
    "kilo": ("kilo", ["run", "--auto", "--agent", "answer", "{q}"],
             ["run", "--auto", "--agent", "answer", "-c", "{q}"]),
    "aider": ("aider", [*AIDER, "--message", "{q}"],
              [*AIDER, "--restore-chat-history", "--message", "{q}"]),
    "llm": ("llm", ["{q}"], ["-c", "{q}"]),
    # Cline 3.0.65's `--id <session-id>` always opens its terminal UI (and drops the
    # prompt): no headless resume (docs/agents/cline.md).
    "cline": ("cline", ["--json", "{q}"], None),
    # Droid's `exec -s <id>` asks Factory's service for the session first (offline here:
    # "Failed to fetch session"); `--fork <id>` copies the local transcript into a new
    # session and continues it, with no account (docs/agents/droid.md).
    "droid": ("droid", [*DROID, "{q}"], [*DROID, "--fork", "{session}", "{q}"]),
}
#: Where an agent's output names its session (for ``{session}``): Droid's JSON result.
SESSION = {"droid": re.compile(r'"session_id":\s*"([^"]+)"')}
#: What some agents need in the throwaway HOME before their first turn.
SETUP = {"qwen": lambda home: qwen_project(home, memory=False),  # no auto-memory request
         "kilo": lambda home: _kilo_agent(home / "project")}
#: Environment of some agents' runs: Cline's as tests/e2e/test_cline.py runs it.
ENV = {"cline": CLINE_RUN_ENV}


def _kilo_agent(project: Path) -> None:
    (project / ".kilo" / "agent").mkdir(parents=True)
    (project / ".kilo" / "agent" / "answer.md").write_text(KILO_ANSWER_AGENT)


#: The server's log line for one generation (kit/engine/decode/pipeline.py).
LINE = re.compile(r"(\S+): \S+, prompt (\d+) tokens \((\d+) cached\), generated \d+, "
                  r"ttft ([\d.]+) s")


def system_of(body: Any) -> str:
    """A request's system prompt, as text to compare: the ``system`` (Anthropic),
    ``instructions`` (Responses) or ``systemInstruction`` (Gemini) field, else its first
    message (Chat Completions' system message; the first item of ``input`` / ``contents``)."""
    if not isinstance(body, dict):
        return ""
    for key in ("system", "instructions", "systemInstruction", "system_instruction"):
        if body.get(key):
            return json.dumps(body[key], sort_keys=True)
    first = body.get("messages") or body.get("input") or body.get("contents") or [""]
    return json.dumps(first if isinstance(first, str) else first[0], sort_keys=True)


@dataclass
class Turn:
    agent: str
    turn: str
    rc: int
    seconds: float
    sent: list[Exchange] = field(default_factory=list)  # its requests, through the relay
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    ttft: float = 0.0
    reuse: float | None = None
    body: Any = None  # the conversation request's


def run_turn(agent: str, label: str, args: list[str], url: str, relay: Relay, home: Path,
             timeout: float) -> tuple[Turn, str]:
    """One headless agent call through `mlx-kit launch`, with the relay's ``url``; the
    turn (its requests in ``sent``) and what the agent printed."""
    project = home / "project"
    project.mkdir(exist_ok=True)
    start = len(relay.exchanges)
    t0 = time.perf_counter()
    # No MLX_KIT_API_KEY: launch rightly refuses to hand a key to the relay's port (not
    # the server's); each agent gets launch's placeholder, which a keyless server takes.
    env = {**bench_env(home), "PWD": str(project), **ENV.get(agent, {})}
    try:
        r = subprocess.run([sys.executable, "-m", "kit", "launch", agent, "--url", url, "--",
                            *args], env=env, cwd=project, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        rc, out = 124, ""
    turn = Turn(agent, label, rc, time.perf_counter() - t0, relay.exchanges[start:])
    if rc != 0:
        print(f"  {agent} {label}: exit {rc}: {out[-600:]}", file=sys.stderr)
    return turn, out


def attribute(turns: list[Turn], log: Path) -> None:
    """Pair each turn's requests with the server's log lines (by request id), count its
    generations, and take its conversation request (module docstring) and reuse."""
    gens = {m[1]: (int(m[2]), int(m[3]), float(m[4])) for m in LINE.finditer(log.read_text())}
    paired = [[(ex, gens[ex.response_id]) for ex in t.sent if ex.response_id in gens]
              for t in turns]
    systems = Counter(system_of(ex.body) for p in paired for ex, _ in p)
    shared = systems.most_common(1)[0][0] if systems else None
    for turn, pairs in zip(turns, paired):
        turn.requests = len(pairs)
        convo = [(g, i, ex.body) for i, (ex, g) in enumerate(pairs)
                 if system_of(ex.body) == shared]
        if convo:  # the largest prompt; of equal ones, the last (a retry)
            (turn.prompt, turn.cached, turn.ttft), _, turn.body = max(
                convo, key=lambda c: (c[0][0], c[1]))
    for prev, turn in zip([None, *turns], turns):
        base = prev.prompt if turn.turn in ("2", "3") and prev else turn.prompt
        turn.reuse = turn.cached / base if base else None


def converse(agent: str, relay: Relay, log: Path, timeout: float) -> list[Turn]:
    """Three turns (turn 1 only without continue args) and a new session of ``agent`` in
    one throwaway HOME, through ``relay``."""
    _, first, cont = AGENTS[agent]
    home = Path(tempfile.mkdtemp(prefix=f"mlx-kit-turns-{agent}-"))
    try:
        plan = [("1", first, QUESTIONS[0]), ("2", cont, QUESTIONS[1]),
                ("3", cont, QUESTIONS[2]), ("new", first, NEW_SESSION)]
        turns: list[Turn] = []
        (home / "project").mkdir(parents=True, exist_ok=True)
        if agent in SETUP:
            SETUP[agent](home)
        session = None
        for label, args, q in plan:
            if args is None:
                continue
            if any("{session}" in a for a in args) and session is None:
                print(f"  {agent} turn {label}: no session id from the turn before",
                      file=sys.stderr)
                turns.append(Turn(agent, label, -1, 0.0))
                continue
            argv = [a.replace("{q}", q).replace("{session}", session or "") for a in args]
            turn, out = run_turn(agent, label, argv, relay.url + "/v1", relay, home, timeout)
            found = SESSION[agent].search(out) if agent in SESSION else None
            session = found[1] if found else None
            turns.append(turn)
            print(f"  {agent} turn {label}: exit {turn.rc}, {len(turn.sent)} requests "
                  f"through the relay, {turn.seconds:.0f} s", file=sys.stderr)
        time.sleep(2)  # a generation the agent cancelled logs when the engine stops it
        attribute(turns, log)
        return turns
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default=",".join(AGENTS),
                    help="comma-separated, of: " + ", ".join(AGENTS))
    ap.add_argument("--url", help="a running server's /v1 (default: start one here)")
    ap.add_argument("--log", type=Path, help="that server's --log-file (with --url)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per agent call")
    ap.add_argument("--draft", action="store_true", help="the server drafts with the 4-bit "
                    "starter (--draft-model; issue 29: agent turns with and without)")
    ap.add_argument("--bodies", type=Path, help="write each turn's conversation request "
                    "body here, as AGENT-TURN.json")
    args = ap.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    missing = [a for a in agents if a not in AGENTS or not shutil.which(AGENTS[a][0])]
    if missing:
        sys.exit(f"unknown or not on PATH: {', '.join(missing)}")

    proc = None
    if args.url:
        if args.log is None:
            sys.exit("--url needs --log (the server's log file)")
        url, log = args.url, args.log
    else:
        work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-"))
        env = bench_env(work / "home")
        env["HF_HOME"] = str(work / "hf")
        (work / "home").mkdir()
        starter(env)
        draft = []
        if args.draft:
            from kit.models.starter import STARTER_4BIT_ID
            draft = ["--draft-model", starter(env, STARTER_4BIT_ID)]
        port, log = free_port(), work / "serve.log"
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--temperature", "0", "--log-file", str(log), *draft], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{port}/health", proc)
        url = f"http://127.0.0.1:{port}/v1"
    try:
        with Relay(url.rstrip("/").removesuffix("/v1")) as relay:
            rows = [t for a in agents for t in converse(a, relay, log, args.timeout)]
    finally:
        if proc is not None:
            if args.draft:  # acceptance over the whole run
                import httpx
                d = httpx.get(url.removesuffix("/v1") + "/health").json().get("draft") or {}
                print(f"draft: {d.get('accepted')} of {d.get('drafted')} proposals kept "
                      f"(acceptance {d.get('acceptance')})")
            proc.terminate()
            proc.wait(30)
    if args.bodies:
        args.bodies.mkdir(parents=True, exist_ok=True)
        for t in rows:
            (args.bodies / f"{t.agent}-{t.turn}.json").write_text(json.dumps(t.body, indent=1))

    print(f"{'agent':9} {'turn':4} {'exit':>4} {'s':>5} {'req':>3} {'prompt':>6} "
          f"{'cached':>6} {'cached%':>7} {'reuse%':>6} {'ttft s':>7}")
    for t in rows:
        pct = f"{100 * t.cached / t.prompt:.1f}" if t.prompt else "-"
        reuse = f"{100 * t.reuse:.1f}" if t.reuse is not None else "-"
        print(f"{t.agent:9} {t.turn:4} {t.rc:>4} {t.seconds:>5.0f} {t.requests:>3} "
              f"{t.prompt:>6} {t.cached:>6} {pct:>7} {reuse:>6} {t.ttft:>7.1f}")
    later = [t for t in rows if t.turn != "1"]
    met = sum(1 for t in later if t.reuse is not None and t.reuse >= 0.95)
    print(f"\nturns 2, 3 and new sessions reusing >= 95 %: {met} of {len(later)}")


if __name__ == "__main__":
    main()
