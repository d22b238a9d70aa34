"""Benchmark: how much of each turn's prompt real agents get from the prompt cache.

Each agent (the real binary, a throwaway HOME, `mlx-kit launch AGENT --url ...`) holds a
three-turn headless conversation (a first question, then two follow-ups with the agent's
own continue/resume flag) and then starts a new session (a different first question),
against one real server on the starter (SmolLM2-135M-Instruct, greedy). Per turn, read from
the server's log (one line per generation: ``prompt N tokens (C cached) ... ttft T s``):
the requests the turn sent, the prompt tokens and cached tokens of its largest request
(the conversation; side requests such as titles are counted, not shown), cached %, and
TTFT. ``reuse`` is the cached tokens over the previous turn's prompt (turns 2 and 3) or
over this turn's prompt (a new session shares only the system prompt and tools); over
100 % when the previous answer was cached too. Goal: reuse >= 95 % on turns 2, 3 and the
new session. A turn's requests are the generations the server logged while the agent ran
(a cancelled one left over from an earlier client counts where it ends).

Usage: python bench/agent_turns.py [--agents claude,pi,...] [--url URL --log FILE]
  (agents on PATH; without --url a server is started here and stopped at the end)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

from tests.e2e.test_qwen import SLIM as QWEN_SLIM  # noqa: E402
from tests.e2e.test_qwen import project as qwen_project  # noqa: E402
from tests.e2e.test_kilo import ANSWER_AGENT as KILO_ANSWER_AGENT  # noqa: E402

#: Copilot's headless switches on the starter (tests/e2e/test_copilot.py), aider's.
COPILOT = ["-s", "--allow-all", "--available-tools=none"]
AIDER = ["--yes-always", "--no-git", "--no-pretty", "--no-stream"]

QUESTIONS = ("What is the capital of France?", "And of Germany?", "And of Italy?")
NEW_SESSION = "What is the capital of Spain?"

#: agent -> (binary, first-turn args, continue args): ``{q}`` is the question. Flags from
#: each agent's own --help (pinned versions: .ci/run).
AGENTS: dict[str, tuple[str, list[str], list[str]]] = {
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
}
#: What some agents need in the throwaway HOME before their first turn.
SETUP = {"qwen": lambda home: qwen_project(home, memory=False),  # no auto-memory request
         "kilo": lambda home: _kilo_agent(home / "project")}


def _kilo_agent(project: Path) -> None:
    (project / ".kilo" / "agent").mkdir(parents=True)
    (project / ".kilo" / "agent" / "answer.md").write_text(KILO_ANSWER_AGENT)
LINE = re.compile(r": \S+, prompt (\d+) tokens \((\d+) cached\), generated \d+, "
                  r"ttft ([\d.]+) s")


@dataclass
class Turn:
    agent: str
    turn: str
    rc: int
    seconds: float
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    ttft: float = 0.0
    reuse: float | None = None


def run_turn(agent: str, label: str, args: list[str], url: str, log: Path, home: Path,
             timeout: float) -> Turn:
    """One headless agent call through `mlx-kit launch`; what the server logged meanwhile."""
    project = home / "project"
    project.mkdir(exist_ok=True)
    start = len(log.read_text().splitlines())
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "kit", "launch", agent, "--url", url, "--",
                            *args], env={**bench_env(home), "MLX_KIT_API_KEY": "mlx-kit", "PWD": str(project)},
                           cwd=project, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        rc, out = 124, ""
    turn = Turn(agent, label, rc, time.perf_counter() - t0)
    if rc != 0:
        print(f"  {agent} {label}: exit {rc}: {out[-600:]}", file=sys.stderr)
    rows = [tuple(map(float, m.groups())) for line in log.read_text().splitlines()[start:]
            if (m := LINE.search(line))]
    if rows:
        prompt, cached, ttft = max(rows)  # the conversation: the turn's largest prompt
        turn.requests, turn.prompt, turn.cached, turn.ttft = len(rows), int(prompt), \
            int(cached), ttft
    return turn


def converse(agent: str, url: str, log: Path, timeout: float) -> list[Turn]:
    """Three turns and a new session of ``agent`` in one throwaway HOME."""
    _, first, cont = AGENTS[agent]
    home = Path(tempfile.mkdtemp(prefix=f"mlx-kit-turns-{agent}-"))
    try:
        plan = [("1", first, QUESTIONS[0]), ("2", cont, QUESTIONS[1]),
                ("3", cont, QUESTIONS[2]), ("new", first, NEW_SESSION)]
        turns: list[Turn] = []
        (home / "project").mkdir(parents=True, exist_ok=True)
        if agent in SETUP:
            SETUP[agent](home)
        for label, args, q in plan:
            turn = run_turn(agent, label, [a.replace("{q}", q) for a in args], url, log, home,
                            timeout)
            base = turns[-1].prompt if label in ("2", "3") and turns else turn.prompt
            turn.reuse = turn.cached / base if base else None
            turns.append(turn)
            print(f"  {agent} turn {label}: {turn.requests} requests, prompt {turn.prompt}, "
                  f"cached {turn.cached}, {turn.seconds:.0f} s", file=sys.stderr)
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
        port, log = free_port(), work / "serve.log"
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--temperature", "0", "--log-file", str(log)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{port}/health", proc)
        url = f"http://127.0.0.1:{port}/v1"
    try:
        rows = [t for a in agents for t in converse(a, url, log, args.timeout)]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)

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
