"""The starter's build process seen from its caller, without building anything: what the
child reports comes back as progress lines or as a one-line ModelError."""

from __future__ import annotations

import pytest

from kit.errors import ModelError
from kit.models import starter


def test_an_error_the_builder_reports_is_raised_with_its_message_and_hint():
    lines: list[str] = []
    with pytest.raises(ModelError) as caught:
        starter._run_builder("nobody/nothing", lines.append)  # the child refuses the id
    assert caught.value.message == "not a starter model id: 'nobody/nothing'"
    assert "mlx-kit/SmolLM2-135M-Instruct" in caught.value.hint
    assert lines == []


def test_ensure_starter_refuses_an_id_that_is_no_starter_before_starting_a_build():
    with pytest.raises(KeyError):
        starter.ensure_starter(repo_id="nobody/nothing")


def test_a_stray_line_on_the_builders_stdout_is_shown_as_progress_not_lost():
    assert starter._parse('{"progress": "converting"}\n') == {"progress": "converting"}
    assert starter._parse("some library said hello\n") == {"progress": "some library said hello"}
    assert starter._parse("[1, 2]\n") == {"progress": "[1, 2]"}
