"""`mlx-kit models` while a server runs on a model folder (`serve --model ./dir`), the way
one tries a family's checkpoint. Found trying issue 14 as a user: `models --json` named the
folder as `local` but listed only the HF cache, so the folder's tool and reasoning formats
were nowhere in it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import clean_env, run_kit, start_server, starter_with_template, stop

DATA = Path(__file__).resolve().parent.parent / "data"


def test_models_lists_the_served_folder_with_its_formats(hf_home, tmp_path):
    folder = starter_with_template(hf_home, tmp_path / "models" / "smollm2-tools",
                                   DATA / "chatml-tools.jinja", tool_parser="json_tools")
    (tmp_path / "home").mkdir()
    (tmp_path / "home-cli").mkdir()
    server = start_server(tmp_path / "home", hf_home, "--model", str(folder))
    try:
        env = clean_env(tmp_path / "home-cli", hf_home)
        r = run_kit(env, "models", "--json", "--url", server.root)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        by_id = {m["id"]: m for m in out["models"]}
        assert out["local"] == str(folder) and by_id[str(folder)]["local"]
        caps = by_id[str(folder)]["capabilities"]
        assert (caps["tools"], caps["tool_format"]) == (True, "json_tools")
        table = run_kit(env, "models", "--url", server.root)
        marked = [ln for ln in table.stdout.splitlines() if ln.startswith("*")]
        assert table.returncode == 0 and marked[0].split()[1] == str(folder)  # marked, whole
    finally:
        stop(server)
