"""docs/cli.md is generated from --help (`python -m kit.cli.docs`): it cannot drift."""

from __future__ import annotations

import subprocess
import sys

from kit.cli import docs
from kit.errors import EXIT_CODE_MEANINGS
from tests.helpers import clean_env


def test_docs_cli_md_is_what_the_generator_writes_now():
    assert docs.DOC.read_text() == docs.render(), (
        "docs/cli.md is out of date: run `python -m kit.cli.docs` (and commit it)")


def test_the_check_does_not_depend_on_the_terminal_or_the_environment(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kit.cli.docs", "--check"],
                       env=clean_env(tmp_path, COLUMNS="43", MLX_KIT_URL="http://10.0.0.9:1"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_reference_has_every_command_and_the_exit_codes():
    text = docs.DOC.read_text()
    for name, _cmd, _ctx in docs._commands():
        assert f"### `{name}`" in text
    for code, meaning in EXIT_CODE_MEANINGS:
        assert f"| {code} | {meaning} |" in text
