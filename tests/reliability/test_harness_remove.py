"""Issue 11, item 1 ("ownership you can prove"): three data-integrity bugs of `harness
remove` a new-user try found. Each test runs the real CLI (``python -m kit``) on a throwaway
HOME against the agents' real file layouts; no agent binary is needed.
"""

from __future__ import annotations

import pytest

from tests.reliability.test_harness_manifest import (  # noqa: F401 - dead_url: a fixture
    USER_FILES, data_dir, dead_url, kit, manifest)
from tests.helpers import table_rows

GEMINI_SETTINGS = ('{\n  "ui": {"theme": "GitHub"},\n'
                   '  "privacy": {"usageStatisticsEnabled": true}\n}\n')
FILES = {**USER_FILES, "gemini": (".gemini/settings.json", GEMINI_SETTINGS)}
MERGED = ("llm", "zed", "crush", "gemini")


def write_user_file(home, agent):
    rel, text = FILES[agent]
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def configured(home) -> dict[str, str]:
    """`harness list`'s configured column, per agent."""
    out = kit(home, "harness", "list").stdout
    return {agent: cells[1] for agent, cells in table_rows(out).items()}


@pytest.mark.parametrize("damage", ["deleted", "stale"])
def test_remove_all_finds_every_agent_even_when_the_manifest_does_not_list_it(
        tmp_path, dead_url, damage):
    home = tmp_path
    paths = {a: write_user_file(home, a) for a in ("qwen", *MERGED)}
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    stale = manifest(home).read_bytes()  # taken after installing only qwen
    for agent in MERGED:
        assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    if damage == "deleted":
        manifest(home).unlink()
        manifest(home).with_name("manifest.json.prev").unlink(missing_ok=True)
    else:
        manifest(home).write_bytes(stale)

    r = kit(home, "harness", "remove", "--all")

    assert r.returncode == 0, r.stderr
    assert "nothing of mlx-kit's is installed" not in r.stdout
    for agent, path in paths.items():
        assert path.read_text() == FILES[agent][1], agent  # every byte of the user's file
        assert f"{agent}: removed mlx-kit's entries from {path}" in r.stdout  # said, per agent
    state = configured(home)
    assert all(state[a] == "no" for a in paths), state
    assert not (data_dir(home) / "backups").exists()


#: agent -> (the text in the user's file to put a comment before, the comment line)
COMMENTS = {
    "zed": ('  "language_models"', "  // my own note\n"),
    "gemini": ('  "privacy"', "  // keep stats on\n"),
    "crush": ('  "options"', "  // debug for now\n"),
    "llm": ("- model_id: gpt-local", "# note\n"),
}


@pytest.mark.parametrize("agent", sorted(COMMENTS))
def test_remove_keeps_a_comment_the_user_added_after_install(tmp_path, dead_url, agent):
    home = tmp_path
    path = write_user_file(home, agent)
    assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    before, comment = COMMENTS[agent]
    text = path.read_text()
    assert before in text
    path.write_text(text.replace(before, comment + before, 1))

    r = kit(home, "harness", "remove", agent)

    assert r.returncode == 0, r.stderr
    expected = FILES[agent][1].replace(before, comment + before, 1)
    assert path.read_text() == expected  # the comment kept, our entries gone


def test_remove_keeps_a_comment_appended_after_our_llm_entry(tmp_path, dead_url):
    home = tmp_path
    path = write_user_file(home, "llm")
    assert kit(home, "harness", "install", "llm", "--url", dead_url).returncode == 0
    path.write_text(path.read_text().rstrip("\n") + "\n# my trailing note\n")

    r = kit(home, "harness", "remove", "llm")

    assert r.returncode == 0, r.stderr
    assert "# my trailing note" in path.read_text()
    assert "gpt-local" in path.read_text() and "model_id: local" not in path.read_text()


@pytest.mark.parametrize("agent", ["zed", "qwen"])
def test_remove_after_the_user_deleted_their_merged_file_does_not_recreate_it(
        tmp_path, dead_url, agent):
    home = tmp_path
    path = write_user_file(home, agent)
    assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    path.unlink()  # the user deleted their settings since install

    r = kit(home, "harness", "remove", agent)

    assert r.returncode == 0, r.stderr
    assert not path.exists()  # stays deleted
    assert "restored your own" not in r.stdout
    assert "stays deleted" in r.stdout
    kept = [p for p in (data_dir(home) / "backups" / agent).iterdir()]
    assert [p.read_text() for p in kept] == [FILES[agent][1]]  # kept, and named
    assert str(kept[0]) in r.stdout.replace("\n", "")


def test_a_file_left_as_it_was_keeps_no_backup_after_a_remove_without_the_manifest(
        tmp_path, dead_url):
    """The user's Gemini settings already said what ours say (model "local"): with the
    manifest lost, remove leaves the file alone, its bytes are the backup's, so the backup
    is no only copy and goes with the rest (found by hypothesis: test_properties.py)."""
    home = tmp_path
    text = ('{"security": {"auth": {"selectedType": "gemini-api-key"}}, "model": {"name": '
            '"local"}, "privacy": {"usageStatisticsEnabled": false}}')
    path = home / ".gemini" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert kit(home, "harness", "install", "gemini", "--url", dead_url).returncode == 0
    manifest(home).unlink()
    manifest(home).with_name("manifest.json.prev").unlink(missing_ok=True)
    r = kit(home, "harness", "remove", "gemini")
    assert r.returncode == 0, r.stderr
    assert path.read_text() == text
    assert not (data_dir(home) / "backups").exists(), list(data_dir(home).rglob("*"))
