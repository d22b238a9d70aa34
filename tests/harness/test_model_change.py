"""Regression (issue 5): configure every agent while model X is behind ``local``; then X is
deleted and Y is loaded; configuring again (what ``mlx-kit launch`` does each time) leaves
no reference to X anywhere mlx-kit wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

from kit.harness.spec_loader import all_specs
from tests.helpers import clean_env, run_kit, start_server, starter_with_template, stop

DATA = Path(__file__).parent.parent / "data"


def _written(home: Path) -> dict[Path, str]:
    return {p: p.read_text(errors="replace") for p in home.rglob("*")
            if p.is_file() and not p.name.startswith("serve-") and p.suffix != ".log"}


def test_no_reference_to_a_deleted_model_remains_after_reconfiguring(hf_home, tmp_path):
    agents = sorted(all_specs())
    home = tmp_path / "home"
    for d in (home, tmp_path / "srv1", tmp_path / "srv2"):
        d.mkdir()
    old = starter_with_template(hf_home, tmp_path / "models" / "old-model-x",
                                DATA / "chatml-tools.jinja", tool_parser="json_tools")
    env = clean_env(home, hf_home)

    def install_all(url: str) -> None:
        for agent in agents:
            r = run_kit(env, "harness", "install", agent, "--url", url)
            assert r.returncode == 0, (agent, r.stdout + r.stderr)

    server = start_server(tmp_path / "srv1", hf_home, "--model", str(old))
    try:
        install_all(server.v1)
    finally:
        stop(server)
    assert any("old-model-x" in text for text in _written(home).values())  # X was baked

    shutil.rmtree(old)
    server = start_server(tmp_path / "srv2", hf_home)  # Y: the starter
    try:
        install_all(server.v1)
    finally:
        stop(server)
    texts = _written(home)
    stale = sorted(str(p.relative_to(home)) for p, t in texts.items() if "old-model-x" in t)
    assert not stale, f"files still naming the deleted model: {stale}"
    assert any("SmolLM2-135M-Instruct" in t for t in texts.values())
