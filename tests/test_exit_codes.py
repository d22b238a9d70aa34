"""The one exit-code table (kit.errors.ExitCode), each code from a real `python -m kit`
invocation, and its documentation in `mlx-kit --help`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kit.errors import EXIT_CODE_MEANINGS, ExitCode
from tests.helpers import clean_env, free_port, run_kit
from tests.models.test_split import llama_like

# A command that only exists in these tests, added to the real app before the real main()
# runs: the unexpected-error and Ctrl-C paths of main() need a command that crashes or
# waits, and no shipped command does either on purpose.
_WITH_TEST_COMMAND = """
import sys, time
from kit.cli import app, main

@app.command("_test")
def _test(what: str) -> None:
    if what == "crash":
        raise RuntimeError("a bug")
    print("waiting", flush=True)
    time.sleep(60)

main(sys.argv[1:])
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A llama-shaped model folder of 50 KB (no real weights: `fit` reads only headers)."""
    return llama_like(tmp_path / "tiny")


def test_help_documents_every_exit_code(home):
    r = run_kit(home, "--help", COLUMNS="80")
    assert r.returncode == ExitCode.OK
    table = r.stdout.split("Exit codes (every command):")[1]
    for code, meaning in EXIT_CODE_MEANINGS:
        assert f"{code:>3}  {meaning}" in table
    assert [c for c, _ in EXIT_CODE_MEANINGS] == [0, 1, 2, 3, 4, 5, 70, 130, 141]


def test_expected_error_exits_1_with_a_hint(home):
    r = run_kit(home, "status", "--url", "ftp://127.0.0.1:1")
    assert r.returncode == ExitCode.ERROR == 1
    assert r.stderr.startswith("error: ") and "\nhint: " in r.stderr


def test_usage_error_exits_2(home):
    r = run_kit(home, "fit", "--no-such-flag")
    assert r.returncode == ExitCode.USAGE == 2
    assert "No such option: --no-such-flag" in r.stderr and "unexpected" not in r.stderr


def test_bad_flag_values_exit_as_the_table_says(home, tiny_model):
    """A value mlx-kit checks itself (a size) is an expected error, 1; a value click
    rejects for its type or range is a usage error, 2: the table's rows say which."""
    size = run_kit(home, "fit", str(tiny_model), "--memory-budget", "lots")
    assert size.returncode == ExitCode.ERROR, size.stderr
    assert "error: --memory-budget: not a size: 'lots'" in size.stderr
    rng = run_kit(home, "logs", "-n", "-1")
    assert rng.returncode == ExitCode.USAGE, rng.stderr
    meanings = dict(EXIT_CODE_MEANINGS)
    assert "flag value" in meanings[ExitCode.ERROR]
    assert "type or range" in meanings[ExitCode.USAGE]


def test_a_servers_error_type_maps_back_to_its_exit_code():
    """/health's error_type is kit.errors.error_kind of the engine's error; the CLI maps it
    back to that error's class (and exit code) with error_class_of_kind."""
    from kit.errors import (ModelDoesNotFitError, ModelError, ModelNotFoundError,
                            error_class_of_kind, error_kind)

    assert error_kind(ModelDoesNotFitError("x")) == "model_does_not_fit"
    assert error_kind(ModelNotFoundError("m", [])) == "model_not_found"
    assert error_class_of_kind("model_does_not_fit").exit_code == ExitCode.DOES_NOT_FIT
    assert error_class_of_kind("model") is ModelError
    assert error_class_of_kind(None) is None and error_class_of_kind("value") is None


def test_no_server_exits_3_for_status_and_swap(home):
    url = f"http://127.0.0.1:{free_port()}"
    status = run_kit(home, "status", "--url", url)
    assert status.returncode == ExitCode.NO_SERVER == 3
    swap = run_kit(home, "swap", "some/model", "--url", url)
    assert swap.returncode == 3
    assert swap.stderr.splitlines() == [
        f"error: no mlx-kit server is running on {url}",
        "hint: start one with `mlx-kit serve` (or `mlx-kit launch AGENT`), or pass --url"]


def test_fit_that_does_not_fit_exits_5_not_2(home, tiny_model):
    r = run_kit(home, "fit", str(tiny_model), "--ctx", str(10**13))
    assert r.returncode == ExitCode.DOES_NOT_FIT == 5
    assert "does NOT fit" in r.stdout
    ok = run_kit(home, "fit", str(tiny_model), "--ctx", "1024")
    assert ok.returncode == 0 and "-> fits" in ok.stdout


def test_unexpected_error_exits_70_with_a_log_path(home):
    r = subprocess.run([sys.executable, "-c", _WITH_TEST_COMMAND, "_test", "crash"],
                       env=clean_env(home), cwd=home, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == ExitCode.SOFTWARE == 70
    first, details = r.stderr.splitlines()[:2]
    assert first == "unexpected error: RuntimeError: a bug"
    log = Path(details.removeprefix("details: "))
    assert log.is_file() and "RuntimeError: a bug" in log.read_text()
    assert str(log).startswith(str(home))  # under the user's log dir, not /tmp


def _terminal_sigint() -> None:
    # A shell's background job (`bash .ci/run &`, nohup) starts with SIGINT ignored, and a
    # Python started with it ignored installs no KeyboardInterrupt handler: the child gets
    # Ctrl-C as it would in a terminal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130(home):
    proc = subprocess.Popen([sys.executable, "-c", _WITH_TEST_COMMAND, "_test", "wait"],
                            env=clean_env(home), cwd=home, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_sigint)
    try:
        assert proc.stdout.readline() == "waiting\n"  # the command is running
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED == 130
    assert "Traceback" not in err


def test_json_errors_carry_the_exit_code(home):
    url = f"http://127.0.0.1:{free_port()}"
    r = run_kit(home, "swap", "some/model", "--json", "--url", url)
    assert r.returncode == 3
    assert json.loads(r.stdout) == {"error": {
        "message": f"no mlx-kit server is running on {url}",
        "hint": "start one with `mlx-kit serve` (or `mlx-kit launch AGENT`), or pass --url",
        "exit_code": 3, "type": "ServerNotRunningError"}}
    assert r.stderr.startswith("error: no mlx-kit server")  # the text stays on stderr
