"""The wheel ships the agent templates and specs and the status page's files, and an
installed wheel finds them.

Builds with ``pip wheel`` (hatchling in an isolated build env); each step has a timeout so
the whole test stays within about a minute.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.helpers import REPO, clean_env

DATA = ["kit/_data/templates/pi/mlx-kit.ts.j2", "kit/_data/harnesses/pi.toml"]


def test_wheel_ships_templates_and_specs_and_finds_them(tmp_path):
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(REPO)], check=True, capture_output=True, timeout=45)
    [wheel] = out.glob("mlx_kit-*.whl")

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in DATA:
            assert name in names
        assert z.read(DATA[0]) == (REPO / "templates/pi/mlx-kit.ts.j2").read_bytes()
        assert z.read(DATA[1]) == (REPO / "harnesses/pi.toml").read_bytes()
        assert "kit/cli/__init__.py" in names
        for name in ("ui.html", "ui.js", "ui.css"):  # the status page (kit/server/ui.py)
            path = f"kit/server/static/{name}"
            assert z.read(path) == (REPO / path).read_bytes()

    # Unpacked on its own (the wheel is pure Python): kit.paths finds kit/_data, and the
    # pi spec loads with its template.
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    code = ("import kit, kit.paths as p; from kit.harness.spec_loader import load_spec; "
            "print(kit.__file__); print(p.templates_dir()); print(p.harnesses_dir()); "
            "print(load_spec('pi').files[0].template)")
    env = clean_env(tmp_path, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        str(site / "kit" / "__init__.py"),
        str(site / "kit" / "_data" / "templates"),
        str(site / "kit" / "_data" / "harnesses"),
        "pi/mlx-kit.ts.j2",
    ]
