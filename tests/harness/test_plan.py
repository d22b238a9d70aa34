"""Install and remove go plan -> apply: `--dry-run` prints the plan and writes nothing, and
the real run then does exactly what it printed. Each test runs the real CLI
(``python -m kit``) on a throwaway HOME against the agents' real file layouts: the dry run
must leave HOME byte-identical, the printed patch applied to the files as they were must
give the files as the real run leaves them, and each file's printed action must be what
the real run says it did.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kit.errors import HarnessError
from kit.harness import apply, install as hi
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.reliability.test_harness_manifest import (  # noqa: F401 - dead_url: a fixture
    USER_FILES, data_dir, dead_url, kit, manifest, user_file)

ACTION = re.compile(r"^(?:(?P<agent>[\w-]+): )?(?:an earlier install the manifest did not "
                    r"record: )?(?P<action>create|overwrite-ours|overwrite-forced|merge|"
                    r"unmerge|restore-backup|delete-ours|leave-alone|refuse) (?P<path>/\S+): ")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for folders)."""
    return {str(p): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def actions(stderr: str) -> list[tuple[str, str]]:
    """The (action, path) lines a dry run printed, in order."""
    return [(m["action"], m["path"]) for m in map(ACTION.match, stderr.splitlines()) if m]


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def apply_patch(files: dict[str, str | None], patch: str) -> dict[str, str | None]:
    """``files`` (path -> text, None: absent) with the unified diff ``patch`` applied, in
    the manner of ``patch -p0`` (written here: GNU patch refuses absolute file names).
    Every context and removed line must be what the file holds."""
    out, lines, i = dict(files), _lines(patch), 0
    while i < len(lines):
        if not lines[i].startswith("--- "):  # "no changes"
            i += 1
            continue
        src, dst = lines[i][4:].rstrip("\n"), lines[i + 1][4:].rstrip("\n")
        i += 2
        path = dst if dst != "/dev/null" else src
        old = _lines(out.get(path) or "") if src != "/dev/null" else []
        new: list[str] = []
        pos = 0
        while i < len(lines) and lines[i].startswith("@@"):
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@", lines[i])
            olds, news = int(m[2] or 1), int(m[3] or 1)  # lines the hunk takes and gives
            start = int(m[1]) if m[2] == "0" else int(m[1]) - 1
            new += old[pos:start]
            pos, i, last = start, i + 1, None
            while olds or news or (i < len(lines) and lines[i].startswith("\\")):
                tag, text = lines[i][0], lines[i][1:]
                if tag == "\\":  # the line before has no newline
                    if last in (" ", "+"):
                        new[-1] = new[-1].rstrip("\n")
                elif tag in " -":
                    assert old[pos].rstrip("\n") == text.rstrip("\n"), (path, pos, text)
                    pos, olds = pos + 1, olds - 1
                    if tag == " ":
                        new.append(text)
                        news -= 1
                else:
                    new.append(text)
                    news -= 1
                last, i = tag, i + 1
        new += old[pos:]
        out[path] = None if dst == "/dev/null" else "".join(new)
    return out


def texts(snap: dict[str, bytes | None], paths: set[str]) -> dict[str, str | None]:
    return {p: None if snap.get(p) is None else snap[p].decode() for p in paths}


#: The real run's words for each action (install: "wrote"/"unchanged"; remove: its lines).
SAID = {"create": "wrote {}", "overwrite-ours": "wrote {}", "overwrite-forced": "wrote {}",
        "merge": "wrote {}", "leave-alone": None, "delete-ours": "removed {}",
        "unmerge": "removed mlx-kit's entries from {}"}


def dry_then_real(home: Path, *args: str) -> list[tuple[str, str]]:
    """Run ``args`` with --dry-run, check it wrote nothing, run it for real, check that it
    did what the dry run printed. Returns the printed actions."""
    before = snapshot(home)
    dry = kit(home, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert snapshot(home) == before  # not a byte, not a folder, not a lock file
    planned = actions(dry.stderr)
    assert planned, dry.stderr

    real = kit(home, *args)
    assert real.returncode == 0, real.stderr
    after = snapshot(home)
    data = str(data_dir(home))
    changed = {p for p in set(before) | set(after)
               if not p.startswith(data) and before.get(p) != after.get(p)
               and (before.get(p) is not None or after.get(p) is not None)}
    targets = {path for _, path in planned}
    assert changed <= targets, changed - targets  # nothing outside the plan was touched
    # the printed patch is the change, byte for byte
    assert apply_patch(texts(before, targets), dry.stdout) == texts(after, targets)
    said = real.stdout.splitlines()
    for action, path in planned:
        b, a = before.get(path), after.get(path)
        if [p for _, p in planned].count(path) > 1:  # a recovery, then the install: the
            continue                                  # patch above checked both
        if action == "leave-alone":
            assert a == b, path
            if "install" in args and b is not None:
                assert f"unchanged {path}" in said
            continue
        assert a != b or action in ("overwrite-ours",), (action, path)
        if action in ("create",):
            assert b is None and a is not None
        if action == "delete-ours":
            assert a is None
        if action == "restore-backup":
            assert (f"removed mlx-kit's entries from {path}" in said
                    or f"restored your own {path} from mlx-kit's backup" in said), said
        elif "--all" not in args:
            assert SAID[action].format(path) in said, (action, path, said)
    return planned


def test_dry_run_install_and_remove_of_a_drop_in_agent(tmp_path, dead_url):
    home = tmp_path
    target = str(home / ".pi" / "agent" / "extensions" / "mlx-kit.ts")
    assert dry_then_real(home, "harness", "install", "pi", "--url", dead_url) == [
        ("create", target)]
    assert dry_then_real(home, "harness", "install", "pi", "--url", dead_url) == [
        ("leave-alone", target)]
    assert dry_then_real(home, "harness", "remove", "pi") == [("delete-ours", target)]
    assert not (home / ".pi").exists()


@pytest.mark.parametrize("agent", ["qwen", "llm", "zed", "crush", "cline", "droid"])
def test_dry_run_install_and_remove_of_a_users_shared_file(tmp_path, dead_url, agent):
    home = tmp_path
    path = user_file(home, agent)
    assert dry_then_real(home, "harness", "install", agent, "--url", dead_url) == [
        ("merge", str(path))]
    assert dry_then_real(home, "harness", "remove", agent) == [("restore-backup", str(path))]
    assert path.read_text() == USER_FILES[agent][1]


def test_dry_run_of_a_removal_that_keeps_a_comment_the_user_added(tmp_path, dead_url):
    home = tmp_path
    path = user_file(home, "zed")
    assert kit(home, "harness", "install", "zed", "--url", dead_url).returncode == 0
    path.write_text(path.read_text().replace('  "theme"', '  // my note\n  "theme"', 1))
    assert dry_then_real(home, "harness", "remove", "zed") == [("unmerge", str(path))]
    assert "// my note" in path.read_text() and "mlx-kit" not in path.read_text()


def test_dry_run_of_a_forced_install_over_the_users_file_and_its_removal(tmp_path, dead_url):
    home = tmp_path
    profile = home / ".codex" / "mlx-kit.config.toml"
    profile.parent.mkdir(parents=True)
    profile.write_text('model = "mine"\n')
    planned = dry_then_real(home, "harness", "install", "codex", "--url", dead_url, "--force")
    assert ("overwrite-forced", str(profile)) in planned
    planned = dry_then_real(home, "harness", "remove", "codex")
    assert ("restore-backup", str(profile)) in planned
    assert profile.read_text() == 'model = "mine"\n'


def test_dry_run_with_a_lost_manifest_shows_the_recovery_first(tmp_path, dead_url):
    """With the manifest gone, install first removes what is provably ours: the dry run
    prints that removal, then the install as the files stand after it."""
    home = tmp_path
    path = user_file(home, "qwen")
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    manifest(home).unlink()
    manifest(home).with_name("manifest.json.prev").unlink(missing_ok=True)
    dry = kit(home, "harness", "install", "qwen", "--url", dead_url, "--dry-run")
    assert f"an earlier install the manifest did not record: restore-backup {path}" \
        in dry.stderr
    assert dry_then_real(home, "harness", "install", "qwen", "--url", dead_url) == [
        ("restore-backup", str(path)), ("merge", str(path))]
    manifest(home).write_text("garbage")
    assert dry_then_real(home, "harness", "remove", "qwen") == [("restore-backup", str(path))]
    assert path.read_text() == USER_FILES["qwen"][1]


def test_dry_run_remove_all_names_each_agent_and_writes_nothing(tmp_path, dead_url):
    home = tmp_path
    settings = user_file(home, "qwen")
    for agent in ("pi", "qwen"):
        assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    before = snapshot(home)
    dry = kit(home, "harness", "remove", "--all", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert snapshot(home) == before
    assert f"qwen: restore-backup {settings}: " in dry.stderr
    assert f"pi: delete-ours {home / '.pi/agent/extensions/mlx-kit.ts'}: " in dry.stderr
    assert "aider:" not in dry.stderr  # nothing there, nothing said


def test_dry_run_of_a_refused_install_prints_the_refusal_and_exits_1(tmp_path, dead_url):
    home = tmp_path
    target = home / ".pi" / "agent" / "extensions" / "mlx-kit.ts"
    target.parent.mkdir(parents=True)
    target.write_text("// mine\n")
    before = snapshot(home)
    r = kit(home, "harness", "install", "pi", "--url", dead_url, "--dry-run")
    assert r.returncode == 1
    assert f"refuse {target}: " in r.stderr and "--force" in r.stderr
    assert "Traceback" not in r.stderr
    assert snapshot(home) == before


def test_a_plan_is_not_applied_to_a_file_that_changed_since(home, dead_url):
    """apply checks each file still holds what the plan saw: an edit in between (another
    program, a second mlx-kit) stops it before anything is written."""
    qwen = load_spec("qwen")
    [(_, settings)] = qwen.file_paths()
    settings.parent.mkdir(parents=True)
    settings.write_text('{"ui": {"theme": "GitHub"}}\n')
    plan = hi.plan(qwen, parse_url(dead_url))
    settings.write_text('{"ui": {"theme": "Dracula"}}\n')  # after planning

    with pytest.raises(HarnessError) as exc:
        apply.install(plan)

    assert "changed while mlx-kit was planning" in exc.value.message
    assert settings.read_text() == '{"ui": {"theme": "Dracula"}}\n'
    assert not data_dir(home).exists()  # no manifest, backup or receipt


def test_the_diff_of_a_file_without_a_last_newline_is_a_patch():
    from kit.harness.plan_types import Step

    step = Step(Path("/x/settings.json"), "merge", "test", '{\n  "a": 1\n}',
                '{\n  "a": 1,\n  "b": "\u2028"\n}')
    diff = step.diff()
    assert "\\ No newline at end of file\n" in diff
    assert apply_patch({"/x/settings.json": step.old}, diff) == {
        "/x/settings.json": step.new}


# --- comments the YAML parser drops (found by tests/harness/test_properties.py) -----------

#: An llm entry identical to ours (marker included), as the user may have copied it in.
LLM_ENTRY = ("- {model_id: local, model_name: local, api_base: http://127.0.0.1:8090/v1, "
             "can_stream: true, supports_tools: true, vision: false, mlx_kit: mlx-kit:generated"
             " (do not edit); `mlx-kit harness remove llm` takes this entry out}\n")
#: ruamel.yaml attaches no comment that follows the empty nested item ``- - `` at the end.
LLM_FILE = LLM_ENTRY * 2 + LLM_ENTRY.replace("api_base: http://127.0.0.1:8090/v1, ", "") + \
    "- - \n"


@pytest.fixture
def llm(home, monkeypatch):
    """llm's spec and its extra-openai-models.yaml on the throwaway HOME; install bakes one
    model with tools (the entry LLM_ENTRY is ours, byte for byte in content)."""
    monkeypatch.delenv("LLM_USER_PATH", raising=False)
    monkeypatch.setattr(hi, "baked_models", lambda url: ([{
        "id": "local", "name": "local", "model": "mlx-community/Qwen3-4B-4bit",
        "context_window": 40960, "max_tokens": 8192,
        "capabilities": {"tools": True, "reasoning": False, "vision": False}}], "test"))
    spec = load_spec("llm")
    [(_, path)] = spec.file_paths()
    path.parent.mkdir(parents=True)
    return spec, path


def test_remove_llm_keeps_a_comment_the_user_added_after_install_that_yaml_drops(llm):
    """The user's file held entries like ours and ended in ``- - ``; they added a comment at
    the end after install. Removal must not put the backup back over it (it used to: the
    comment check looked at the parsed-and-dumped text, which had already lost it), and
    must not write a text without it."""
    from kit.harness.formats import loads

    spec, path = llm
    path.write_text(LLM_FILE)
    hi.install(spec, parse_url("http://127.0.0.1:8090"))
    path.write_text(path.read_text() + "# zz-added-later \n")

    [step] = hi.plan_removal(spec).steps
    assert step.action == "unmerge"  # not restore-backup: the backup lacks the comment
    hi.remove(spec)

    text = path.read_text()
    assert text.endswith("- - \n# zz-added-later \n")
    assert loads("yaml", text, "now") == loads("yaml", LLM_FILE, "before")


def test_remove_llm_without_edits_still_gives_back_the_users_exact_bytes(llm):
    spec, path = llm
    path.write_text(LLM_FILE + "# mine, at the end\n")
    hi.install(spec, parse_url("http://127.0.0.1:8090"))
    hi.remove(spec)
    assert path.read_text() == LLM_FILE + "# mine, at the end\n"


def test_remove_refuses_rather_than_drop_a_comment_yaml_cannot_keep(llm, home):
    """A comment after ``- - `` in the middle of the file is one ruamel.yaml loses wherever
    we write: removal stops with an error naming it, and writes nothing."""
    spec, path = llm
    path.write_text("- {model_id: mine}\n")
    hi.install(spec, parse_url("http://127.0.0.1:8090"))
    edited = path.read_text() + "- - \n# my note\n- {model_id: other}\n"
    path.write_text(edited)
    before = snapshot(home)

    with pytest.raises(HarnessError) as exc:
        hi.remove(spec)

    assert "'# my note'" in exc.value.message and str(path) in exc.value.message
    assert "move the comment" in exc.value.hint
    assert snapshot(home) == before  # the file, the manifest and the backup as they were


def test_remove_keeps_the_backup_holding_a_comment_yaml_could_not_keep(llm, home):
    """ruamel.yaml moves an end-of-line comment after ``-  `` (under ``- - ``) to a line of
    its own at install, where its next load drops it. Removal after another edit cannot
    keep it in the file, so the user's file from before install, which has it, is kept
    and the removal says where."""
    spec, path = llm
    original = "- model_id: mine\n  k:\n  - - \n  -  # my note\n    - \n    - \n"
    path.write_text(original)
    hi.install(spec, parse_url("http://127.0.0.1:8090"))
    path.write_text("# added later\n" + path.read_text())

    done = hi.remove(spec)

    assert path.read_text().startswith("# added later\n") and "mlx-kit" not in path.read_text()
    [note] = [n for n in done.notes if "'# my note'" in n]
    backup = Path(note.rpartition(" is kept at ")[2])
    assert backup.read_text() == original


def test_remove_keeps_the_backup_holding_a_comment_install_could_not_keep(llm):
    """A comment after ``- - `` in the middle of the user's file is dropped by install's
    merge (its only copy is the backup); a removal that cannot put the backup back keeps
    it, and says where."""
    spec, path = llm
    original = "- model_id: mine\n- - \n# my note\n- {model_id: other}\n"
    path.write_text(original)
    hi.install(spec, parse_url("http://127.0.0.1:8090"))
    assert "# my note" not in path.read_text()  # (ruamel.yaml 0.19; the reason for this)
    path.write_text("# added later\n" + path.read_text())

    done = hi.remove(spec)

    assert path.read_text().startswith("# added later\n") and "mlx-kit" not in path.read_text()
    [note] = [n for n in done.notes if "'# my note'" in n]
    assert Path(note.rpartition(" is kept at ")[2]).read_text() == original
