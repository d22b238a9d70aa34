"""Fixtures for the harness tests: a throwaway HOME for this process, a URL nobody serves.

``platformdirs`` and ``HarnessSpec.config_dir`` read HOME (and the XDG variables) at call
time, so setting them with monkeypatch moves mlx-kit's manifest and pi's agent dir into
``tmp_path`` for in-process calls; ``tests.conftest.clean_env`` does the same for
subprocesses.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import free_port


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME with no XDG, mlx-kit, pi or Hugging Face settings; PI_OFFLINE=1.
    (MLX_KIT_REQUIRE_AGENTS stays: it is a setting of the test run, not of mlx-kit.)"""
    for key in list(os.environ):
        if key.startswith(("XDG_", "MLX_KIT_", "PI_", "HF_")) and key != "MLX_KIT_REQUIRE_AGENTS":
            monkeypatch.delenv(key)
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.setenv("PI_OFFLINE", "1")
    # An empty hub cache: the baked fallback list never depends on this machine's models.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    return path


@pytest.fixture
def dead_url() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
