"""docs/agents/adding-an-agent.md, run: its worked example (the fictional agent parrot: a
drop-in file, a merge file, [vars]) is taken out of the page, put in a throwaway user
config dir, listed, installed into a throwaway HOME with `mlx-kit harness install` and
removed again, leaving the user's file byte for byte as it was. Model-free: the install
points at a URL nobody serves, so the baked model list is the empty hub cache's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from kit.harness.spec_loader import load_all, load_spec
from tests.conftest import REPO, clean_env
from tests.helpers import table_rows

DOC = REPO / "docs" / "agents" / "adding-an-agent.md"
BLOCK = re.compile(r"^```\w+ path=(\S+)\n(.*?)^```$", re.M | re.S)


def doc_files() -> dict[str, str]:
    """The page's ``path=`` blocks: {path: text} (``~/`` paths are under HOME, the others
    under mlx-kit's config folder)."""
    files = {path: text for path, text in BLOCK.findall(DOC.read_text(encoding="utf-8"))}
    assert set(files) == {"harnesses/parrot.toml", "templates/parrot/models.json.j2",
                          "templates/parrot/settings.yaml.j2", "~/.parrot/settings.yaml"}
    return files


def lay_out(home: Path) -> Path:
    """Write the example into ``home``; returns the user's settings file."""
    for path, text in doc_files().items():
        target = home / path[2:] if path.startswith("~/") else \
            home / ".config" / "mlx-kit" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return home / ".parrot" / "settings.yaml"


def kit(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", *args], env=clean_env(home), cwd=home,
                          capture_output=True, text=True, timeout=60)


def rows(out: str) -> dict[str, list[str]]:
    """`harness list`'s plain table, by agent: its cells."""
    return table_rows(out)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def test_the_worked_example_lists_installs_and_removes_cleanly(tmp_path, dead_url):
    home = tmp_path
    settings = lay_out(home)
    before = snapshot(home / ".parrot")
    users_text = settings.read_bytes()

    r = kit(home, "harness", "list")
    assert r.returncode == 0, r.stderr
    table = rows(r.stdout)
    assert table["parrot"][1:3] == ["no", "/v1/chat/completions"]
    assert "pi" in table and "codex" in table  # the built-ins are still there
    assert "your own agents" in r.stdout and "parrot" in r.stdout.split("your own agents")[1]

    r = kit(home, "harness", "install", "parrot", "--url", dead_url)
    assert r.returncode == 0, r.stderr
    drop_in = json.loads((home / ".parrot" / "mlx-kit.models.json").read_text())
    assert drop_in["base_url"] == f"{dead_url}/v1"
    assert drop_in["models"][0]["id"] == "local"
    assert (drop_in["request_timeout_s"], drop_in["stream"]) == (120, True)  # its [vars]
    merged_text = settings.read_text()
    merged = YAML().load(merged_text)
    assert merged["default_provider"] == "mlx-kit"
    assert merged["providers"]["mlx-kit"]["base_url"] == f"{dead_url}/v1"
    assert merged["providers"]["openrouter"]["base_url"] == "https://openrouter.ai/api/v1"
    assert "# my parrot settings" in merged_text and "# easier on the eyes" in merged_text
    assert rows(kit(home, "harness", "list").stdout)["parrot"][1] == "yes"

    r = kit(home, "harness", "remove", "parrot")
    assert r.returncode == 0, r.stderr
    assert settings.read_bytes() == users_text
    assert snapshot(home / ".parrot") == before
    assert rows(kit(home, "harness", "list").stdout)["parrot"][1] == "no"


def test_the_worked_example_launches_with_its_files_and_key(home):
    lay_out(home)
    spec = load_spec("parrot")
    assert not spec.builtin and spec.source == home / ".config/mlx-kit/harnesses/parrot.toml"
    argv, env = spec.launch_command("/bin/parrot", ["hello"], environ={})
    assert argv == ["/bin/parrot", "--models", str(home / ".parrot" / "mlx-kit.models.json"),
                    "hello"]
    assert env == {"PARROT_API_KEY": "mlx-kit"}
    assert load_all().problems == {}


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace('name = "parrot"', 'name = "pi"'), "agent 'pi' is already defined by "),
    (lambda t: t.replace("strategy = ", "stratgy = "), "files[1].stratgy: unknown key"),
], ids=["reuses-a-builtin-name", "typo"])
def test_a_refused_user_spec_is_named_and_the_other_agents_still_list(tmp_path, dead_url, edit,
                                                                    problem):
    home = tmp_path
    lay_out(home)
    spec = home / ".config" / "mlx-kit" / "harnesses" / "parrot.toml"
    spec.write_text(edit(spec.read_text()))

    r = kit(home, "harness", "list")

    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith(f"error: {spec}: {problem}")
    table = rows(r.stdout)
    assert "parrot" not in table and table["pi"][1:3] == ["no", "/v1/chat/completions"]
    # the built-in pi is the one that loads, unchanged
    r = kit(home, "harness", "show", "pi", "--url", dead_url)
    assert r.returncode == 0 and "extensions/mlx-kit.ts" in r.stdout
