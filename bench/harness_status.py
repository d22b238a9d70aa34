"""How long `harness status` spends asking agents for their version: one after another (as
before) vs all at once (kit.harness.versions), with the agent binaries on PATH.

    PYTHONPATH=. python bench/harness_status.py [--rounds 3]

Prints one row per agent (its own --version time) and the two totals, each the median of
the rounds. Every probe runs with a throwaway HOME (see kit/harness/versions.py).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kit.harness.spec_loader import all_specs
from kit.harness.versions import _run, probe_env, probe_versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    agents = [(s, shutil.which(s.binary)) for s in all_specs().values() if shutil.which(s.binary)]
    if not agents:
        raise SystemExit("no agent binary on PATH")
    each: dict[str, list[float]] = {s.name: [] for s, _ in agents}
    serial, parallel = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            env = probe_env([s for s, _ in agents], Path(tmp))
            t_all = time.perf_counter()
            for spec, binary in agents:
                t0 = time.perf_counter()
                _run(binary, env, Path(tmp), 15)
                each[spec.name].append(time.perf_counter() - t0)
            serial.append(time.perf_counter() - t_all)
        t0 = time.perf_counter()
        probe_versions(agents)
        parallel.append(time.perf_counter() - t0)
    print(f"{'agent':<10} {'--version s':>12}")
    for name, times in each.items():
        print(f"{name:<10} {statistics.median(times):>12.2f}")
    print(f"{'serial':<10} {statistics.median(serial):>12.2f}")
    print(f"{'parallel':<10} {statistics.median(parallel):>12.2f}")


if __name__ == "__main__":
    main()
