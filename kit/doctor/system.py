"""The machine's side of ``doctor``: the Python running mlx-kit, mlx (imported in a child
process: :mod:`kit.doctor.mlx_probe`) and its device, and on Linux CPU the BLAS it uses."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

from kit.blas import ENV, PACKAGE, SPEEDUP
from kit.doctor.check import Check
from kit.models.memory import human

#: pyproject.toml's requires-python
MIN_PYTHON = (3, 10)
#: Seconds the mlx child may take (an import is ~0.5 s; a hang must not hang doctor)
MLX_TIMEOUT_S = 30.0


def python_check() -> Check:
    """The Python that runs mlx-kit (and the server it starts: the same interpreter)."""
    version = platform.python_version()
    data = {"version": version, "executable": sys.executable}
    if sys.version_info[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Check("system", "python", "fail", f"{version} is older than {need}",
                     f"install mlx-kit under Python {need} or newer", data)
    return Check("system", "python", "ok", f"{version} ({sys.executable})", data=data)


def _install_hint() -> str:
    extra = "[cpu]" if sys.platform.startswith("linux") else ""
    return f"{sys.executable} -m pip install 'mlx{extra}' (or reinstall mlx-kit)"


def probe_mlx(timeout: float = MLX_TIMEOUT_S) -> tuple[dict | None, str]:
    """Run :mod:`kit.doctor.mlx_probe` in a child process.

    Returns:
        (its JSON object, "") or (None, why: the last line of its stderr, or that it
        timed out). Never raises.
    """
    try:
        r = subprocess.run([sys.executable, "-m", "kit.doctor.mlx_probe"], timeout=timeout,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"importing mlx did not finish in {timeout:g} s"
    except OSError as e:
        return None, f"cannot run {sys.executable}: {e.strerror}"
    if r.returncode == 0:
        try:
            return json.loads(r.stdout.strip().splitlines()[-1]), ""
        except (ValueError, IndexError):
            pass
    lines = [ln.strip() for ln in (r.stderr or "").splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit code {r.returncode}"
    return None, why[:200]


def mlx_checks(timeout: float = MLX_TIMEOUT_S) -> list[Check]:
    """mlx's import and version, its device, and (Linux CPU) its BLAS."""
    info, why = probe_mlx(timeout)
    if info is None:
        return [Check("system", "mlx", "fail", f"mlx does not work: {why}", _install_hint(),
                      {"error": why})]
    checks = [Check("system", "mlx", "ok", f"mlx {info['mlx']}", data={"version": info["mlx"]})]
    checks.append(_device(info))
    if info["device"] == "cpu" and sys.platform.startswith("linux"):
        checks.append(_blas(info))
    return checks


def _device(info: dict) -> Check:
    data = {k: info.get(k) for k in ("device", "metal", "cuda", "working_set", "memory_size")}
    if not info.get("computed"):
        return Check("system", "device", "fail", f"mlx's {info['device']} device computed a "
                     "wrong result (4x4 ones matmul)", _install_hint(), data)
    if info.get("metal"):
        ws, size = info.get("working_set"), info.get("memory_size")
        where = f", working set {human(ws)}" if ws else ""
        of = f" of {human(size)}" if ws and size else ""
        return Check("system", "device", "ok", f"Metal GPU{where}{of} (the most a model "
                     "and its KV cache may use)", data=data)
    if info.get("cuda"):
        return Check("system", "device", "ok", "CUDA GPU", data=data)
    if info.get("platform") == "darwin":
        return Check("system", "device", "warn", "CPU only: mlx sees no Metal device",
                     "run on Apple silicon with macOS 14 or newer (a Rosetta Python sees no "
                     "Metal: use an arm64 Python)", data)
    return Check("system", "device", "ok", "CPU (mlx's Linux CPU build)", data=data)


def _blas(info: dict) -> Check:
    data = {"blas": info.get("blas"), "setting": info.get("blas_setting")}
    setting = (info.get("blas_setting") or "auto")
    if info.get("blas"):
        return Check("system", "blas", "ok", f"OpenBLAS {info['blas']}", data=data)
    if setting.lower() in ("off", "0", "none", ""):
        return Check("system", "blas", "warn", f"turned off ({ENV}={setting}): mlx uses its "
                     "bundled reference BLAS", f"unset {ENV}: {SPEEDUP}", data)
    if setting.lower() != "auto":
        return Check("system", "blas", "warn", f"{ENV}={setting} did not load: mlx uses its "
                     "bundled reference BLAS", f"point {ENV} at libopenblas.so.0, or unset it",
                     data)
    return Check("system", "blas", "warn", "no OpenBLAS found: mlx uses its bundled "
                 "reference BLAS", f"sudo apt-get install {PACKAGE} (mlx-kit loads it by "
                 f"itself): {SPEEDUP}", data)
