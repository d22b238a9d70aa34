"""Check: the split planner's per-rank weights (kit/models/split.py, no mlx) against what
mlx-lm really holds on each rank once the ranks are up.

For each case it starts `mlx.launch --backend ring -n N` on loopback; every rank loads the
model as `serve --ranks` does (tensor: `sharded_load`; pipeline: `load_model` +
`model.model.pipeline(group)`, which is what sharded_load does before it loads the local
files) and prints the bytes of its parameters; the table puts them next to the plan.

Usage: python bench/split_check.py [MODEL_FOLDER --ranks N [--pipeline]]
       (no arguments: the starter, f32 and 4-bit, over 3 ranks)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, starter  # noqa: E402

from kit.models.split import plan_split  # noqa: E402

RANK = """
import json, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
group = mx.distributed.init()
if sys.argv[2] == "pipeline":
    from mlx_lm.utils import load_model
    model, _ = load_model(Path(sys.argv[1]), lazy=True, strict=False)
    model.model.pipeline(group)
else:
    from mlx_lm.utils import sharded_load
    model, _ = sharded_load(sys.argv[1])
n = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
print(json.dumps({"rank": group.rank(), "bytes": n}), flush=True)
"""


def loaded(folder: Path, ranks: int, mode: str, workdir: Path) -> dict[int, int]:
    """Parameter bytes per rank, measured on ``ranks`` ring ranks on loopback."""
    script = workdir / "rank.py"
    script.write_text(RANK)
    launcher = Path(sys.executable).with_name("mlx.launch")
    out = subprocess.run([str(launcher), "--backend", "ring", "-n", str(ranks), "--python",
                          sys.executable, str(script), str(folder), mode],
                         capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if len(rows) != ranks:
        raise RuntimeError(f"mlx.launch gave {len(rows)} of {ranks} ranks:\n{out.stderr[-2000:]}")
    return {r["rank"]: r["bytes"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--pipeline", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model:
            cases = [(args.model, args.ranks, args.pipeline)]
        else:
            env = bench_env(work / "home")
            (work / "home").mkdir()
            f32 = Path(starter(env))
            q4 = Path(starter(env, "mlx-kit/SmolLM2-135M-Instruct-4bit"))
            cases = [(f32, 3, False), (q4, 3, False)]
        print(f"{'model':<44} {'mode':<8} {'rank':>4} {'layers':>7} {'planned':>12} "
              f"{'loaded':>12} {'diff':>6}")
        for folder, ranks, pipe in cases:
            plan = plan_split(folder, ranks, pipe)
            real = loaded(folder, ranks, plan.mode, work)
            # a hub snapshot is named by its repo folder, not its commit hash
            name = (folder.parent.parent.name if folder.parent.name == "snapshots"
                    else folder.name)[-44:]
            for share in plan.per_rank:
                got = real[share.rank]
                layers = f"{share.layers[0]}-{share.layers[1] - 1}"
                print(f"{name:<44} {plan.mode:<8} {share.rank:>4} {layers:>7} "
                      f"{share.weights_bytes:>12} {got:>12} "
                      f"{(share.weights_bytes - got) / got:>+6.1%}")


if __name__ == "__main__":
    main()
