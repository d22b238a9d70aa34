"""Benchmark: wall time of one `pi -p` answer through mlx-kit vs through mlx_lm.server.

Both servers run side by side in this one run, on the same model (the starter, dense
float32), greedy, with the same BLAS (OpenBLAS when the machine has it; mlx_lm.server gets
it through LD_PRELOAD, mlx-kit loads it itself). pi runs with a throwaway HOME, compaction
off for both (so each call is exactly one request), the same prompt, calls alternating
between the servers. Also measured: starter conversion time and server ready time.

Usage: python bench/pi_turn.py [--calls N]      (needs `pi` on PATH)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, openblas, wait_ready  # noqa: E402

PROMPT = "What is the capital of France? Answer in one sentence."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=4, help="pi calls per server")
    args = ap.parse_args()
    pi = shutil.which("pi")
    if not pi:
        sys.exit("pi is not on PATH (npm install -g @mariozechner/pi-coding-agent)")

    blas = openblas()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-"))
    home, hf = work / "home", work / "hf"
    home.mkdir()
    env = {k: v for k, v in bench_env(home).items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf), PI_OFFLINE="1")

    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "from kit.models.starter import ensure_starter;"
                          "print(ensure_starter())"], env=env, check=True, capture_output=True,
                         text=True)
    conversion_s = time.perf_counter() - t0
    model_path = out.stdout.strip().splitlines()[-1]

    kit_port, ref_port = free_port(), free_port()
    procs = []
    kit_proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(kit_port),
                                 "--temperature", "0", "--log-file", str(work / "kit.log")],
                                env=env, stdout=open(work / "kit.log", "w"),
                                stderr=subprocess.STDOUT)
    procs.append(kit_proc)
    kit_ready = wait_ready(f"http://127.0.0.1:{kit_port}/health", kit_proc)
    ref_env = {**env, **({"LD_PRELOAD": blas} if blas else {})}
    ref_proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", model_path,
                                 "--port", str(ref_port), "--temp", "0.0"], env=ref_env,
                                stdout=open(work / "ref.log", "w"), stderr=subprocess.STDOUT)
    procs.append(ref_proc)
    ref_ready = wait_ready(f"http://127.0.0.1:{ref_port}/v1/models", ref_proc)
    try:
        agent = home / ".pi" / "agent"
        agent.mkdir(parents=True)
        (agent / "settings.json").write_text(json.dumps(
            {"compaction": {"enabled": False}, "retry": {"enabled": False}}))
        subprocess.run([sys.executable, "-m", "kit", "harness", "install", "pi", "--url",
                        f"http://127.0.0.1:{kit_port}"], env=env, check=True, capture_output=True)
        (agent / "models.json").write_text(json.dumps({"providers": {"mlxlm": {
            "baseUrl": f"http://127.0.0.1:{ref_port}/v1", "apiKey": "none",
            "api": "openai-completions", "models": [{
                "id": model_path, "name": "starter via mlx_lm.server", "contextWindow": 8192,
                "maxTokens": 2048, "reasoning": False, "input": ["text"],
                "compat": {"supportsDeveloperRole": False}}]}}}))

        targets = {"mlx-kit": ["--provider", "mlx-kit", "--model", "local"],
                   "mlx_lm.server": ["--provider", "mlxlm", "--model", model_path]}
        times: dict[str, list[float]] = {k: [] for k in targets}
        answers: dict[str, str] = {}
        t = time.perf_counter()
        subprocess.run([pi, "--version"], env=env, capture_output=True)
        pi_start = time.perf_counter() - t
        for _ in range(args.calls):
            for name, sel in targets.items():
                t = time.perf_counter()
                r = subprocess.run([pi, *sel, "--no-session", "-p", PROMPT], env=env, cwd=home,
                                   capture_output=True, text=True, timeout=600)
                times[name].append(time.perf_counter() - t)
                if r.returncode != 0:
                    raise RuntimeError(f"{name}: pi failed: {r.stderr[-500:]}")
                answers[name] = r.stdout.strip()
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)

    print(f"model: starter (SmolLM2-135M-Instruct, dense f32); BLAS: {blas or 'bundled'}")
    print(f"starter conversion (fresh cache, incl. imports): {conversion_s:.2f} s")
    print(f"server ready: mlx-kit {kit_ready:.2f} s, mlx_lm.server {ref_ready:.2f} s")
    print(f"pi start alone (pi --version): {pi_start:.2f} s\n")
    print(f"| server | call 1 (cold) s | calls 2..{args.calls} median s | all median s |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        warm = statistics.median(ts[1:]) if len(ts) > 1 else float("nan")
        print(f"| {name} | {ts[0]:.2f} | {warm:.2f} | {statistics.median(ts):.2f} |")
    k, r = times["mlx-kit"], times["mlx_lm.server"]
    print(f"\nratio mlx_lm.server / mlx-kit (median, >1 means mlx-kit is faster): "
          f"{statistics.median(r) / statistics.median(k):.2f}")
    print(f"ratio cold call: {r[0] / k[0]:.2f}")
    for name, a in answers.items():
        print(f"{name} answered: {a[:100]!r}")


if __name__ == "__main__":
    main()
