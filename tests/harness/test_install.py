"""The harness lifecycle on a throwaway HOME: install writes pi's extension (and only that),
remove undoes exactly what install did and never touches the user's own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness import manifest
from kit.harness.render import MARKER
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.helpers import agentless_path, clean_env, run_kit, snapshot

USER_EXTENSION = "// the user's own pi extension\nexport default function (pi) {}\n"


@pytest.fixture
def pi():
    return load_spec("pi")


@pytest.fixture
def target(home) -> Path:
    return home / ".pi" / "agent" / "extensions" / "mlx-kit.ts"


# --- install ----------------------------------------------------------------------------

def test_install_writes_the_extension_in_the_pi_agent_dir(pi, home, target, dead_url):
    result = hi.install(pi, parse_url(dead_url + "/v1/"))

    assert result.written == [target]
    text = target.read_text()
    assert MARKER in text.splitlines()[0]
    assert f'const BASE_URL = "{dead_url}/v1";' in text
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    [entry] = manifest.read()["agents"]["pi"]["files"]
    assert entry["path"] == str(target)
    assert hi.status(pi).installed


def test_pi_coding_agent_dir_moves_the_extension(pi, home, tmp_path, dead_url, monkeypatch):
    agent_dir = tmp_path / "elsewhere" / "agent"
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(agent_dir))

    result = hi.install(pi, parse_url(dead_url))

    assert result.written == [agent_dir / "extensions" / "mlx-kit.ts"]
    assert (agent_dir / "extensions" / "mlx-kit.ts").is_file()
    assert not (home / ".pi").exists()


def test_dry_run_writes_nothing_and_the_diff_names_the_target(pi, home, target, dead_url):
    before = snapshot(home)

    result = hi.install(pi, parse_url(dead_url), dry_run=True)

    assert result.written == []
    assert snapshot(home) == before
    [change] = result.changes
    assert change.path == target and change.old is None
    diff = change.diff().splitlines()
    assert diff[:2] == ["--- /dev/null", f"+++ {target}"]
    assert f"+// {MARKER}" in diff


def test_reinstall_with_identical_content_writes_nothing(pi, home, target, dead_url):
    hi.install(pi, parse_url(dead_url))
    before = (target.read_bytes(), target.stat().st_mtime_ns)

    again = hi.install(pi, parse_url(dead_url))

    assert again.written == []
    assert [c.changed for c in again.changes] == [False]
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before


def test_install_refuses_to_overwrite_the_users_file_unless_forced(pi, home, target, dead_url):
    target.parent.mkdir(parents=True)
    target.write_text(USER_EXTENSION)

    with pytest.raises(HarnessError) as exc:
        hi.install(pi, parse_url(dead_url))
    assert str(target) in exc.value.message
    assert "--force" in exc.value.hint
    assert target.read_text() == USER_EXTENSION
    assert "pi" not in manifest.read()["agents"]

    result = hi.install(pi, parse_url(dead_url), force=True)
    assert result.written == [target]
    assert MARKER in target.read_text().splitlines()[0]


def test_forced_install_backs_up_the_users_file_and_remove_restores_it(pi, home, target,
                                                                        dead_url):
    target.parent.mkdir(parents=True)
    target.write_text(USER_EXTENSION)
    target.chmod(0o600)
    hi.install(pi, parse_url(dead_url), force=True)
    hi.install(pi, parse_url(dead_url))  # a later install keeps the original backup

    result = hi.remove(pi)

    assert result.restored == [target]
    assert target.read_text() == USER_EXTENSION
    assert target.stat().st_mode & 0o777 == 0o600


# --- remove -------------------------------------------------------------------------------

def test_remove_deletes_the_folders_install_created(pi, home, target, dead_url):
    assert not (home / ".pi").exists()
    hi.install(pi, parse_url(dead_url))

    removed = hi.remove(pi).removed

    assert removed[0] == target
    assert not target.parent.exists()
    assert not (home / ".pi").exists()
    assert "pi" not in manifest.read()["agents"]
    assert not hi.status(pi).installed


def test_remove_leaves_an_existing_extensions_folder_as_it_was(pi, home, target, dead_url):
    folder = target.parent
    folder.mkdir(parents=True)
    (folder / "user-ext.ts").write_text(USER_EXTENSION)
    before = snapshot(home / ".pi")

    hi.install(pi, parse_url(dead_url))
    assert sorted(p.name for p in folder.iterdir()) == ["mlx-kit.ts", "user-ext.ts"]
    assert hi.remove(pi).removed == [target]

    assert snapshot(home / ".pi") == before
    assert (folder / "user-ext.ts").read_bytes() == USER_EXTENSION.encode()


@pytest.mark.parametrize("edit", [
    lambda text: text + "// my own tweak\n",
    lambda text: text.split("\n", 1)[1],  # the marker line deleted
], ids=["appended", "marker-removed"])
def test_remove_refuses_an_edited_file_unless_forced(pi, home, target, dead_url, edit):
    hi.install(pi, parse_url(dead_url))
    edited = edit(target.read_text())
    target.write_text(edited)

    with pytest.raises(HarnessError) as exc:
        hi.remove(pi)
    assert str(target) in exc.value.message
    assert "--force" in exc.value.hint
    assert target.read_text() == edited
    assert "pi" in manifest.read()["agents"]

    assert target in hi.remove(pi, force=True).removed
    assert not target.exists()


def test_remove_without_manifest_deletes_only_a_file_with_the_marker(pi, home, target, dead_url):
    hi.install(pi, parse_url(dead_url))
    manifest.manifest_path().unlink()

    # the receipt beside the backups says which folders the install created
    assert hi.remove(pi).removed == [target, target.parent, target.parent.parent,
                                     target.parent.parent.parent]
    assert not target.exists() and not (home / ".pi").exists()

    target.parent.mkdir(parents=True)
    target.write_text(USER_EXTENSION)  # the user's own file at our path
    assert hi.remove(pi).removed == []
    assert target.read_text() == USER_EXTENSION


# --- through the real command line --------------------------------------------------------

def list_row(home: Path, agent: str) -> dict:
    """``agent``'s entry in `harness list --json`."""
    r = run_kit(home, "harness", "list", "--json")
    assert r.returncode == 0, r.stderr
    [row] = [a for a in json.loads(r.stdout)["agents"] if a["name"] == agent]
    return row


def test_cli_install_list_remove(home, target, dead_url):
    r = run_kit(home, "harness", "install", "pi", "--url", dead_url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("wrote ")
    assert "no mlx-kit server answered at" in r.stdout
    assert f'const BASE_URL = "{dead_url}/v1";' in target.read_text()

    assert list_row(home, "pi")["installed"] is True

    r = run_kit(home, "harness", "install", "pi", "--url", dead_url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("unchanged ")

    r = run_kit(home, "harness", "remove", "pi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed ")
    assert not target.exists() and not (home / ".pi").exists()

    assert list_row(home, "pi")["installed"] is False
    r = run_kit(home, "harness", "remove", "pi")
    assert r.returncode == 0 and "nothing of mlx-kit's was installed for pi" in r.stdout


def test_cli_install_refuses_users_file_without_traceback(home, target, dead_url):
    target.parent.mkdir(parents=True)
    target.write_text(USER_EXTENSION)

    r = run_kit(home, "harness", "install", "pi", "--url", dead_url)

    assert r.returncode == 1
    assert "was not written by mlx-kit" in r.stderr and "--force" in r.stderr
    assert "Traceback" not in r.stderr
    assert target.read_text() == USER_EXTENSION


def test_cli_dry_run_prints_the_exact_unified_diff(home, target, dead_url):
    """The printed diff is usable as a diff: its '+' lines are exactly the file install then
    writes (no line wrapped or folded to the terminal width), and '+++' names the target."""
    r = run_kit(home, "harness", "install", "pi", "--url", dead_url, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert not target.exists()
    lines = r.stdout.splitlines()
    assert lines[:2] == ["--- /dev/null", f"+++ {target}"], lines[:4]

    assert run_kit(home, "harness", "install", "pi", "--url", dead_url).returncode == 0
    added = [line[1:] for line in lines[3:]]
    assert all(line.startswith("+") for line in lines[3:]), [
        line for line in lines[3:] if not line.startswith("+")][:3]
    assert added == target.read_text().splitlines()


def test_remove_after_agent_dir_moved_removes_both_installs(pi, home, target, tmp_path,
                                                            dead_url, monkeypatch):
    """Regression: installing again under another PI_CODING_AGENT_DIR used to replace the
    manifest entry, so `remove` left the first extension behind for pi to keep loading."""
    hi.install(pi, parse_url(dead_url))
    moved = tmp_path / "other" / "agent"
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(moved))
    hi.install(pi, parse_url(dead_url))

    removed = hi.remove(pi).removed

    assert target in removed and moved / "extensions" / "mlx-kit.ts" in removed
    assert not target.exists() and not (home / ".pi").exists()
    assert not (moved / "extensions" / "mlx-kit.ts").exists()


def test_install_does_not_overwrite_an_edited_extension_unless_forced(pi, home, target,
                                                                      dead_url, monkeypatch):
    """Regression: remove refused to delete an edited file but install silently
    overwrote the same edits."""
    hi.install(pi, parse_url(dead_url))
    edited = target.read_text() + "// my tweak\n"
    target.write_text(edited)
    monkeypatch.setattr(hi, "baked_models", lambda url: ([], "test"))  # content would change
    with pytest.raises(hi.EditedFileError):
        hi.install(pi, parse_url(dead_url))
    assert target.read_text() == edited
    hi.install(pi, parse_url(dead_url), force=True)
    assert "// my tweak" not in target.read_text()


def test_a_manifest_of_the_wrong_shape_is_kept_aside_and_install_goes_on(pi, home, dead_url,
                                                                        capsys):
    path = manifest.manifest_path()
    path.parent.mkdir(parents=True)  # mlx-kit makes its data folder only when it writes
    path.write_text('{"agents": {"pi": {"files": "oops"}}}')
    hi.install(pi, parse_url(dead_url))
    assert "corrupt" in capsys.readouterr().err
    [aside] = path.parent.glob("manifest.json.broken-*")
    assert aside.read_text() == '{"agents": {"pi": {"files": "oops"}}}'
    assert "pi" in manifest.read()["agents"]


def test_an_unwritable_config_dir_is_a_clear_error(pi, home, tmp_path, dead_url, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(blocker / "agent"))
    with pytest.raises(HarnessError) as exc:
        hi.install(pi, parse_url(dead_url))
    assert "cannot write" in exc.value.message and str(blocker) in exc.value.message
    assert blocker.read_text() == "not a folder"


def test_cli_status_show_and_remove_all(home, dead_url):
    # the plain table never breaks a cell at 80 columns; no agent's --version is run
    env = clean_env(home, COLUMNS="80", PATH=agentless_path())
    for agent in ("pi", "llm", "codex"):
        assert run_kit(env, "harness", "install", agent, "--url", dead_url).returncode == 0
    codex_profile = home / ".codex" / "mlx-kit.config.toml"
    codex_profile.write_text(codex_profile.read_text() + "# my edit\n")

    status = run_kit(env, "harness", "status")
    assert status.returncode == 0
    rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:] if line}
    assert " yes " in rows["pi"] and " yes " in rows["llm"] and " no " in rows["aider"]
    assert " yes, edited " in rows["codex"]  # codex drifted: said in its row, its path below
    assert f"codex: edited since mlx-kit wrote it (launch keeps your edits): {codex_profile}" \
        in status.stdout.splitlines()
    host_port = dead_url.split("://", 1)[1]
    assert f" {host_port} down " in rows["pi"]  # nothing listens where its config points
    table = status.stdout.split("\n\n")[0]  # the notes below it hold whole paths
    assert max(map(len, table.splitlines())) <= 80
    assert "(not " not in status.stdout
    as_json = run_kit(env, "harness", "status", "--json", "--url", "http://127.0.0.1:1")
    assert as_json.returncode == 0, as_json.stderr
    agents = {a["name"]: a for a in json.loads(as_json.stdout)["agents"]}
    assert agents["pi"]["installed"] and agents["pi"]["base_url"] == f"{dead_url}/v1"
    assert agents["pi"]["server"] == {"kind": "none", "status": None, "model": None,
                                      "elsewhere": True}  # configured for another server
    assert agents["codex"]["drift"] == [str(codex_profile)]
    assert agents["aider"]["server"] is None  # not configured: nothing to compare
    same = run_kit(env, "harness", "status", "--url", dead_url)
    assert "(not " not in same.stdout

    show = run_kit(env, "harness", "show", "codex", "--url", dead_url)
    assert show.returncode == 0 and 'wire_api = "responses"' in show.stdout

    first = run_kit(env, "harness", "remove", "--all")
    assert first.returncode == 1 and "codex" in first.stderr  # codex was edited...
    assert not (home / ".pi").exists()  # ...and the other agents were still removed
    assert (home / ".codex" / "mlx-kit.config.toml").exists()
    removed = run_kit(env, "harness", "remove", "--all", "--force")
    assert removed.returncode == 0
    assert not (home / ".pi").exists() and not (home / ".codex").exists()
    assert not (home / ".config" / "io.datasette.llm").exists()
    assert run_kit(env, "harness", "remove").returncode == 1  # neither an agent nor --all


# --- found by the property tests (tests/harness/test_properties.py) -----------------------

@pytest.mark.parametrize("agent, text", [
    ("llm", ""),
    ("llm", "# - model_id: gpt-4o-mini\n#   model_name: all of mine commented out\n"),
    ("llm", "- model_id: mine\r\n  model_name: written on Windows\r\n"),
    ("qwen", "  \n"),
    ("qwen", '{\r\n  "ui": {\r\n    "theme": "GitHub"\r\n  }\r\n}\r\n'),
], ids=["llm-empty", "llm-only-comments", "llm-crlf", "qwen-blank", "qwen-crlf"])
def test_remove_gives_back_an_empty_or_crlf_file_byte_for_byte(agent, text, home, dead_url,
                                                                monkeypatch):
    """An empty or comment-only file holds no document, which install fingerprinted as
    "null" and removal as an empty list/mapping, so removal wrote "[]"/"{}" instead of the
    user's bytes; and files were read with newline translation, so CRLF came back as LF."""
    models = [{"id": "local", "name": "local", "model": "m", "context_window": 4096,
               "max_tokens": 512, "capabilities": {"tools": True, "vision": False}}]
    monkeypatch.setattr(hi, "baked_models", lambda url: (models, "test entries"))
    monkeypatch.delenv("LLM_USER_PATH", raising=False)
    monkeypatch.delenv("QWEN_HOME", raising=False)
    spec = load_spec(agent)
    [(_, path)] = spec.file_paths()
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode())

    hi.install(spec, parse_url(dead_url))
    assert path.read_bytes() != text.encode()
    hi.remove(spec)

    assert path.read_bytes() == text.encode()


def test_remove_deletes_the_folder_install_made_for_several_files(home, dead_url):
    """Codex's profile and model catalog both go into a new ~/.codex: only the first file
    recorded the folder as created, and removal in install order tried to delete it while
    the catalog was still there, so an empty ~/.codex stayed behind."""
    codex = load_spec("codex")
    hi.install(codex, parse_url(dead_url))
    assert sorted(p.name for p in (home / ".codex").iterdir()) == [
        "mlx-kit.config.toml", "mlx-kit.models.json"]
    removed = hi.remove(codex).removed
    assert home / ".codex" in removed
    assert not (home / ".codex").exists()


@pytest.mark.parametrize("edit_after_install", [False, True], ids=["restored", "unmerged"])
def test_a_settings_file_that_links_into_dotfiles_stays_a_link(home, dead_url, monkeypatch,
                                                               edit_after_install):
    """os.replace put a regular file where the user's symbolic link was: install and
    removal left ~/.config/io.datasette.llm/extra-openai-models.yaml a copy, and the
    dotfiles file it linked to was never updated again."""
    monkeypatch.setattr(hi, "baked_models", lambda url: (
        [{"id": "local", "name": "local", "model": "m", "context_window": 4096,
          "max_tokens": 512, "capabilities": {"tools": True, "vision": False}}], "test"))
    monkeypatch.delenv("LLM_USER_PATH", raising=False)
    spec = load_spec("llm")
    [(_, path)] = spec.file_paths()
    dotfiles = home / "dotfiles" / "llm-models.yaml"
    dotfiles.parent.mkdir()
    mine = "# mine\n- model_id: gpt-mine\n  model_name: gpt-4o-mini\n"
    dotfiles.write_text(mine)
    path.parent.mkdir(parents=True)
    path.symlink_to(dotfiles)

    hi.install(spec, parse_url(dead_url))
    assert path.is_symlink() and path.resolve() == dotfiles
    assert "model_id: \"local\"" in dotfiles.read_text() and mine in dotfiles.read_text()
    if edit_after_install:
        mine_too = "- model_id: gpt-also-mine\n  model_name: gpt-4o\n"
        dotfiles.write_text(dotfiles.read_text() + mine_too)
    hi.remove(spec)

    assert path.is_symlink() and path.resolve() == dotfiles
    assert dotfiles.read_text() == mine + (mine_too if edit_after_install else "")


@pytest.mark.parametrize("corrupt, where", [
    (lambda f: f.update(owned="x"), "agents.llm.files[0].owned: input should be a valid "
                                    "dictionary"),
    (lambda f: f["owned"].update(entries=[1]), "agents.llm.files[0].owned.entries"),
    (lambda f: f["owned"].update(previous=7), "agents.llm.files[0].owned.previous"),
    (lambda f: f.update(backup=3), "agents.llm.files[0].backup: input should be a valid string"),
    (lambda f: f.update(created_dirs="abc"), "agents.llm.files[0].created_dirs"),
], ids=["owned", "entries", "previous", "backup", "created_dirs"])
def test_a_manifest_record_of_the_wrong_type_is_corrupt_and_remove_still_restores(
        home, dead_url, monkeypatch, capsys, corrupt, where):
    """The manifest's shape was checked only down to each file's path: an `owned` or
    `backup` of the wrong type crashed `harness list/status/install/remove` with an
    AttributeError/TypeError, and nothing could be removed."""
    import json

    monkeypatch.setattr(hi, "baked_models", lambda url: (
        [{"id": "local", "name": "local", "model": "m", "context_window": 4096,
          "max_tokens": 512, "capabilities": {"tools": True, "vision": False}}], "test"))
    monkeypatch.delenv("LLM_USER_PATH", raising=False)
    spec = load_spec("llm")
    [(_, path)] = spec.file_paths()
    path.parent.mkdir(parents=True)
    mine = "# mine\n- model_id: gpt-mine\n  model_name: gpt-4o-mini\n"
    path.write_text(mine)
    hi.install(spec, parse_url(dead_url))
    data = json.loads(manifest.manifest_path().read_text())
    corrupt(data["agents"]["llm"]["files"][0])
    manifest.manifest_path().write_text(json.dumps(data))
    manifest.previous_path().unlink(missing_ok=True)

    assert hi.status(spec).installed
    hi.remove(spec)
    assert path.read_text() == mine
    assert f"is corrupt: unexpected structure at {where}" in capsys.readouterr().err


def test_a_copy_of_pis_spec_under_another_name_neither_overwrites_nor_removes_pis_file(
        home, dead_url, monkeypatch):
    """adding-an-agent.md says: to change a built-in, copy its spec under a new name. The
    copy has pi's path, and the marker says "mlx-kit's", not whose: installing the copy
    overwrote pi's extension (even without --force) and removing it deleted pi's file,
    with or without a manifest."""
    from kit.paths import harnesses_dir, templates_dir

    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    root = home / ".config" / "mlx-kit"
    (root / "harnesses").mkdir(parents=True)
    (root / "harnesses" / "mypi.toml").write_text(
        (harnesses_dir() / "pi.toml").read_text().replace('name = "pi"', 'name = "mypi"'))
    (root / "templates" / "pi").mkdir(parents=True)
    for t in (templates_dir() / "pi").iterdir():
        (root / "templates" / "pi" / t.name).write_text(t.read_text() + "// mine\n")
    pi, mypi = load_spec("pi"), load_spec("mypi")
    hi.install(pi, parse_url(dead_url))
    [(_, path)] = pi.file_paths()
    pis = path.read_bytes()

    for force in (False, True):
        with pytest.raises(HarnessError) as exc:
            hi.install(mypi, parse_url(dead_url), force=force)
        assert exc.value.message == f"{path} is pi's: `mlx-kit harness install pi` wrote it"
    assert path.read_bytes() == pis
    for manifest_lost in (False, True):
        if manifest_lost:
            manifest.manifest_path().unlink()
            manifest.previous_path().unlink(missing_ok=True)
        result = hi.remove(mypi)
        assert result.removed == [] and path.read_bytes() == pis
        assert result.notes == [f"left {path}: `mlx-kit harness install pi` wrote it"]
    assert hi.remove(pi).removed[0] == path and not path.exists()


@pytest.mark.parametrize("folder", ["~/.pi/agent/extensions/..", "~/pi-link/agent"],
                         ids=["dot-dot", "through-a-link"])
def test_a_copy_of_pis_spec_naming_pis_folder_another_way_neither_overwrites_nor_removes_it(
        home, dead_url, monkeypatch, folder):
    """Issue 25: other agents' files were matched by the path's spelling: a copy of pi's
    spec whose folder named pi's another way (``..``, a link) overwrote pi's extension
    and its removal deleted it."""
    import os

    from kit.paths import harnesses_dir, templates_dir

    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    root = home / ".config" / "mlx-kit"
    (root / "harnesses").mkdir(parents=True)
    (root / "harnesses" / "mypi.toml").write_text(
        (harnesses_dir() / "pi.toml").read_text().replace('name = "pi"', 'name = "mypi"')
        .replace('default = "~/.pi/agent"', f'default = "{folder}"'))
    (root / "templates" / "pi").mkdir(parents=True)
    for t in (templates_dir() / "pi").iterdir():
        (root / "templates" / "pi" / t.name).write_text(t.read_text() + "// mine\n")
    pi, mypi = load_spec("pi"), load_spec("mypi")
    hi.install(pi, parse_url(dead_url))
    os.symlink(home / ".pi", home / "pi-link")
    [(_, path)] = pi.file_paths()
    [(_, alias)] = mypi.file_paths()
    assert alias != path and alias.resolve() == path.resolve()
    pis = path.read_bytes()
    for force in (False, True):
        with pytest.raises(HarnessError) as exc:
            hi.install(mypi, parse_url(dead_url), force=force)
        assert exc.value.message == f"{alias} is pi's: `mlx-kit harness install pi` wrote it"
    assert path.read_bytes() == pis
    result = hi.remove(mypi)
    assert result.removed == [] and path.read_bytes() == pis


@pytest.mark.parametrize("agent, force", [("llm", False), ("pi", True)],
                         ids=["merged-file", "forced-drop-in"])
def test_a_target_that_is_not_utf8_is_a_clean_refusal_and_stays_as_it_was(
        agent, force, home, tmp_path, dead_url, monkeypatch):
    """A user's settings file with one non-UTF-8 byte crashed install and remove with a
    UnicodeDecodeError (the plan reads them strictly, so a backup keeps every byte)."""
    monkeypatch.delenv("LLM_USER_PATH", raising=False)
    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    spec = load_spec(agent)
    [(_, path)] = spec.file_paths()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"# caf\xe9 in latin-1\n")
    before = snapshot(home)
    runs = [lambda: hi.install(spec, parse_url(dead_url), force=force)]
    if not force:  # a merged file is parsed on removal too; an unmarked drop-in is left
        runs.append(lambda: hi.remove(spec))
    for run in runs:
        with pytest.raises(HarnessError) as exc:
            run()
        assert exc.value.message == (f"{path} is not UTF-8 text (byte 0xe9 at offset 5); "
                                     "mlx-kit changes nothing in it")
    assert snapshot(home) == before
    r = run_kit(clean_env(home), "harness", "install", agent, "--url", dead_url, cwd=tmp_path)
    assert r.returncode == 1 and "is not UTF-8 text" in r.stderr and "Traceback" not in r.stderr
