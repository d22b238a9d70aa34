"""docs/models.md's families table is what bench/families_table.py renders from the results
recorded with it (bench/families.json), so the docs cannot drift from the tests. Model-free.
To refresh both after running tests/families/test_families.py, see the script's docstring."""

from __future__ import annotations

import importlib.util
import json

from tests.families.families import FAMILIES
from tests.helpers import REPO


def _script():
    spec = importlib.util.spec_from_file_location("families_table",
                                                  REPO / "bench" / "families_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_models_table_is_rendered_from_the_recorded_results():
    table = _script()
    record = json.loads((REPO / "bench" / "families.json").read_text("utf-8"))
    docs = (REPO / "docs" / "models.md").read_text("utf-8")
    assert table.block(docs) == table.render(record), \
        "docs/models.md is stale: python bench/families_table.py --write"


def test_the_record_has_every_family_of_the_table():
    record = json.loads((REPO / "bench" / "families.json").read_text("utf-8"))
    assert sorted(record["families"]) == sorted(f.name for f in FAMILIES)
