"""The note a Linux CPU user without OpenBLAS gets before a first long prefill
(kit.blas.missing_blas_note, printed by `launch` when it starts a server)."""

from __future__ import annotations

import sys

import pytest

from kit import blas


@pytest.fixture
def no_openblas(monkeypatch):
    """This machine as one with no OpenBLAS and mlx's CPU build (mocked: this machine has
    OpenBLAS installed, for the suite's own speed)."""
    monkeypatch.setattr(blas, "_CANDIDATES", ("/nonexistent/libopenblas.so.0",))
    monkeypatch.setattr(blas.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(blas, "_cuda_build", lambda: False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv(blas.ENV, raising=False)


def test_a_cpu_without_openblas_hears_the_fix_and_the_speed_up(no_openblas):
    assert blas.missing_blas_note() == (
        "no OpenBLAS found: prompt processing (prefill) on this CPU uses mlx's bundled "
        "reference BLAS. Install OpenBLAS (`sudo apt-get install libopenblas0-pthread`; "
        "mlx-kit loads it by itself): prefill's float32 matmuls ~34x faster "
        "(512x576x1536: 150 ms bundled, 4.4 ms)")


def test_a_missing_path_in_mlx_kit_blas_is_named(no_openblas, monkeypatch):
    monkeypatch.setenv(blas.ENV, "/opt/mine/libopenblas.so")
    assert blas.missing_blas_note().startswith(
        "MLX_KIT_BLAS=/opt/mine/libopenblas.so does not exist: prompt processing")


@pytest.mark.parametrize("case", ["found", "off", "cuda", "macos"])
def test_no_note_where_nothing_is_missing(no_openblas, monkeypatch, tmp_path, case):
    if case == "found":
        lib = tmp_path / "libopenblas.so.0"
        lib.write_bytes(b"")
        monkeypatch.setattr(blas, "_CANDIDATES", (str(lib),))
    elif case == "off":
        monkeypatch.setenv(blas.ENV, "off")  # the user's own choice
    elif case == "cuda":
        monkeypatch.setattr(blas, "_cuda_build", lambda: True)
    else:
        monkeypatch.setattr(sys, "platform", "darwin")
    assert blas.missing_blas_note() is None


def test_mlx_s_cpu_build_is_not_taken_for_the_cuda_one():
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("mlx-cpu")
    except PackageNotFoundError:
        pytest.skip("mlx's CPU build is not what is installed here")
    assert blas._cuda_build() is False
