"""Issue 13: the read-only commands leave a fresh HOME as they found it. `harness list`
and `harness status` left an empty ``~/.local/share/mlx-kit`` behind (kit/paths.py created
its folders on every call), `status` an empty ``~/.local/state/mlx-kit``, and `harness
remove --all` with nothing installed an empty ``~/.local/share``. Each command runs
as the real CLI (``python -m kit``) on a throwaway HOME; nothing listens at the URL."""

from __future__ import annotations

from tests.helpers import agentless_path, clean_env, free_port, run_kit, snapshot


def test_read_commands_leave_no_folder_in_a_fresh_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    url = f"http://127.0.0.1:{free_port()}"  # nothing answers: a user without a server
    env = clean_env(home, COLUMNS="250", PATH=agentless_path())  # no agent --version runs
    # `remove --all` with nothing installed writes nothing either (it took the manifest's
    # lock in a folder made for it, and left ~/.local/share behind)
    expected_rc = {"harness list": 0, "harness status": 0, "models": 0, "status": 3,
                   "harness remove --all": 0}
    for command, rc in expected_rc.items():
        args = command.split() + (["--url", url] if command in ("harness status", "models",
                                                                "status") else [])
        r = run_kit(env, *args, cwd=tmp_path)
        assert r.returncode == rc, f"{command}: {r.stdout}{r.stderr}"
        wrote = snapshot(home)
        assert wrote == {}, f"`mlx-kit {command}` wrote into HOME: {sorted(wrote)}"
