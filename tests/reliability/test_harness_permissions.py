"""Issue 11, item 8: install and remove agree on permissions. A read-only target is refused
with a message naming it (never overwritten silently, never a bare "Permission denied"
halfway through a removal), and a folder where a file belongs is named as the target, not
as a temporary file.

Tests run as root here, where permission bits do not stop writes; mlx-kit checks the
file's write bits itself (a file made read-only says "leave me alone" to root too), so
these tests prove the behaviour a non-root user gets. (Running the CLI as ``nobody`` is not
possible here: the shared virtualenv is not readable by other users.)
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.helpers import clean_env, free_port, run_kit
from tests.reliability.test_harness_manifest import QWEN_SETTINGS


@pytest.fixture
def url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def settings(tmp_path: Path) -> Path:
    path = tmp_path / ".qwen" / "settings.json"
    path.parent.mkdir()
    path.write_text(QWEN_SETTINGS)
    return path


def test_install_refuses_a_read_only_settings_file(tmp_path, settings, url):
    settings.chmod(0o444)

    r = run_kit(clean_env(tmp_path), "harness", "install", "qwen", "--url", url)

    assert r.returncode == 1
    assert f"{settings}: the file is read-only" in r.stderr
    assert "chmod u+w" in r.stderr
    assert "Traceback" not in r.stderr
    assert settings.read_text() == QWEN_SETTINGS
    assert stat.S_IMODE(settings.stat().st_mode) == 0o444
    assert not (tmp_path / ".local" / "share" / "mlx-kit" / "manifest.json").exists()


def test_remove_refuses_a_file_made_read_only_and_works_once_writable(tmp_path, settings,
                                                                       url):
    assert run_kit(clean_env(tmp_path), "harness", "install", "qwen", "--url", url).returncode == 0
    settings.chmod(0o444)
    installed = settings.read_text()

    r = run_kit(clean_env(tmp_path), "harness", "remove", "qwen")

    assert r.returncode == 1
    assert f"{settings}: the file is read-only" in r.stderr
    assert "Permission denied" not in r.stderr and "Traceback" not in r.stderr
    assert settings.read_text() == installed  # nothing half-done

    settings.chmod(0o644)
    assert run_kit(clean_env(tmp_path), "harness", "remove", "qwen").returncode == 0
    assert settings.read_text() == QWEN_SETTINGS


def test_remove_refuses_a_read_only_drop_in_file(tmp_path, url):
    assert run_kit(clean_env(tmp_path), "harness", "install", "pi", "--url", url).returncode == 0
    ext = tmp_path / ".pi" / "agent" / "extensions" / "mlx-kit.ts"
    ext.chmod(0o444)

    r = run_kit(clean_env(tmp_path), "harness", "remove", "pi")

    assert r.returncode == 1 and f"{ext}: the file is read-only" in r.stderr
    assert ext.is_file()


@pytest.mark.parametrize("agent, rel", [("qwen", ".qwen/settings.json"),
                                        ("pi", ".pi/agent/extensions/mlx-kit.ts")])
def test_install_over_a_folder_names_the_target_not_a_temp_file(tmp_path, url, agent, rel):
    target = tmp_path / rel
    target.mkdir(parents=True)

    r = run_kit(clean_env(tmp_path), "harness", "install", agent, "--url", url)

    assert r.returncode == 1
    assert f"{target}: it is a folder, not a file" in r.stderr
    assert ".tmp" not in r.stderr and "Traceback" not in r.stderr
    assert target.is_dir() and not any(target.iterdir())


def test_install_under_a_file_where_a_folder_belongs_names_it(tmp_path, url):
    (tmp_path / ".qwen").write_text("not a folder")

    r = run_kit(clean_env(tmp_path), "harness", "install", "qwen", "--url", url)

    assert r.returncode == 1
    assert f"{tmp_path / '.qwen'} is a file, not a folder" in r.stderr
    assert (tmp_path / ".qwen").read_text() == "not a folder"
