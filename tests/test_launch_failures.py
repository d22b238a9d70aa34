"""launch's failure paths: a server that cannot start is reported with its log's tail."""

from __future__ import annotations

from tests.helpers import clean_env, free_port, run_kit


def test_launch_reports_a_server_that_dies_with_the_log_tail(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_pi = bin_dir / "pi"
    fake_pi.write_text("#!/bin/sh\necho fake pi ran\n")
    fake_pi.chmod(0o755)
    env = clean_env(tmp_path, tmp_path / "hf", PATH=f"{bin_dir}:{clean_env(tmp_path)['PATH']}")
    url = f"http://127.0.0.1:{free_port()}"
    r = run_kit(env, "launch", "pi", "--url", url, "--model", str(tmp_path / "no-such-model"))
    assert r.returncode == 1
    assert "server exited" in r.stderr
    assert "no-such-model" in r.stderr and "not found" in r.stderr  # from the log's tail
    assert "full log:" in r.stderr
    assert "fake pi ran" not in r.stdout
    # what launch printed before pointing at the full log (the error and the log's tail)
    assert "Traceback" not in r.stderr.split("full log:")[0]
