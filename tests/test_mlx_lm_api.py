"""The mlx-lm boundary (kit/mlx_lm_api.py): every name kit uses is there in the installed
mlx-lm, no kit module imports mlx-lm but the boundary, and pyproject.toml bounds mlx-lm to
the minor versions the boundary was checked against."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from kit import mlx_lm_api

ROOT = Path(__file__).resolve().parents[1]


def test_every_mlx_lm_name_kit_uses_is_in_the_installed_mlx_lm():
    gone = mlx_lm_api.missing()
    assert not gone, (
        f"mlx-lm {version('mlx-lm')} lacks {len(gone)} name(s) kit uses: {', '.join(gone)}. "
        f"kit/mlx_lm_api.py was checked against mlx-lm {', '.join(mlx_lm_api.CHECKED)}: "
        "adapt the modules that use these names, then update NAMES, CHECKED and "
        "pyproject.toml's bound, and run the whole suite")


def test_every_tool_parser_keeps_mlx_lms_parser_module_contract():
    for name in mlx_lm_api.TOOL_PARSERS:
        module = mlx_lm_api.tool_parser(name)
        lacks = [n for n in ("parse_tool_call", "tool_call_start", "tool_call_end")
                 if not hasattr(module, n)]
        assert not lacks, f"mlx_lm.tool_parsers.{name} has no {', '.join(lacks)}"


def test_the_wrapper_still_holds_the_hugging_face_tokenizer_where_kit_reads_it():
    source = inspect.getsource(mlx_lm_api.TokenizerWrapper)
    assert f"self.{mlx_lm_api.HF_TOKENIZER_ATTR} =" in source, (
        f"mlx-lm's TokenizerWrapper no longer sets self.{mlx_lm_api.HF_TOKENIZER_ATTR}: "
        "update kit.mlx_lm_api.HF_TOKENIZER_ATTR / hf_tokenizer()")


def test_the_installed_mlx_lm_is_a_checked_minor_version():
    minor = lambda v: tuple(int(x) for x in v.split(".")[:2])  # noqa: E731
    assert minor(version("mlx-lm")) in {minor(v) for v in mlx_lm_api.CHECKED}, (
        f"mlx-lm {version('mlx-lm')} is installed; kit/mlx_lm_api.py was checked against "
        f"{mlx_lm_api.CHECKED}")


def test_pyproject_bounds_mlx_lm_and_json_five_to_the_tested_minor_versions():
    text = (ROOT / "pyproject.toml").read_text()
    for dist in ("mlx-lm", "json-five"):
        m = re.search(rf'"{dist}>=([\d.]+),<([\d.]+)"', text)
        assert m, f"pyproject.toml has no upper bound for {dist}"
        low, high = m.groups()
        major, minor_ = (int(x) for x in version(dist).split(".")[:2])
        assert high == f"{major}.{minor_ + 1}", (
            f"{dist} {version(dist)} is installed but pyproject.toml allows <{high}")


def test_only_the_boundary_imports_mlx_lm():
    found = []
    for path in sorted((ROOT / "kit").rglob("*.py")):
        if path.name == "mlx_lm_api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                      if n == "mlx_lm" or n.startswith("mlx_lm.")]
    assert not found, "import mlx-lm through kit.mlx_lm_api:\n" + "\n".join(found)


def test_importing_the_boundary_imports_neither_mlx_nor_mlx_lm():
    code = ("import sys, kit.mlx_lm_api as m; m.source_root(); "
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('mlx', 'mlx_lm')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_json_five_nodes_still_carry_the_private_tokens_jsonc_text_reads():
    # kit/harness/jsonc_text.py finds each node's span from json-five's private ``_tok`` /
    # ``_end_tok``; pyproject.toml bounds json-five to the minor version checked
    import json5
    from json5.loader import ModelLoader

    root = json5.loads('{"a": [1, 2]}', loader=ModelLoader()).value
    assert hasattr(root, "_tok") and hasattr(root, "_end_tok"), (
        f"json-five {version('json-five')}'s nodes lack _tok/_end_tok: "
        "adapt kit/harness/jsonc_text.py, then move pyproject.toml's bound")
