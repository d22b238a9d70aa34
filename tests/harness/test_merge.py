"""Merging our entries into users' shared config files and taking them out again, by keys:
every other key, comment and byte stays; removal restores the file."""

from __future__ import annotations

import pytest

from kit.errors import HarnessError
from kit.harness.formats import loads
from kit.harness.merge import MergeSpec, fingerprint, merge, unmerge

YAML_LIST = MergeSpec("yaml", "list-by-key", key="model_id")
TOML_KEYS = MergeSpec("toml", "keys", owns=("model_providers.mlx-kit", "profile_default"))
JSON_KEYS = MergeSpec("json", "keys", owns=("provider.mlx-kit",))

OURS = {
    "yaml": '- model_id: "local"\n  model_name: "local"\n  api_base: "http://127.0.0.1:8090/v1"\n',
    "toml": '[model_providers.mlx-kit]\nname = "mlx-kit"\nbase_url = "http://127.0.0.1:8090/v1"\n',
    "json": '{"provider": {"mlx-kit": {"name": "mlx-kit", "options": {"baseURL": "x"}}}}',
}
USER_FILES = {
    "yaml": [
        "",
        "[]\n",
        "# mine\n- model_id: a  # keep me\n  model_name: \"gpt-4o\"\n  aliases: ['x', \"y\"]\n",
        "- model_id: local\n  model_name: old-local\n- model_id: b\n  model_name: c\n",
        "- &anchor\n  model_id: a\n  model_name: m\n  headers: {X: '1'}\n",
    ],
    "toml": [
        "",
        '# codex\nmodel = "o3" # keep\n\n[model_providers.other]\nname = "x"\n',
        '[model_providers]\n# a comment inside\n[model_providers.mlx-kit]\nname = "stale"\n',
        'profile = "x"\n[tui]\nnotifications = true\n',
    ],
    "json": [
        '{}\n',
        '{\n  "theme": "dark",\n  "provider": {\n    "other": {\n      "a": 1\n    }\n  }\n}\n',
        '{\n  "provider": {}\n}\n',
    ],
}
SPECS = {"yaml": YAML_LIST, "toml": TOML_KEYS, "json": JSON_KEYS}
CASES = [(fmt, text) for fmt, texts in USER_FILES.items() for text in texts]


@pytest.mark.parametrize("fmt, user", CASES)
def test_merge_then_unmerge_keeps_everything_of_the_users(fmt, user):
    spec = SPECS[fmt]
    merged, record = merge(spec, user or None, OURS[fmt], "f")
    assert record["entries"]
    doc = loads(fmt, merged, "f")
    ours = loads(fmt, OURS[fmt], "ours")
    if fmt == "yaml":
        assert [e for e in doc if e["model_id"] == "local"] == ours
        assert sum(1 for e in doc if e["model_id"] == "local") == 1  # replaced, not doubled
    else:
        assert fingerprint(doc["provider" if fmt == "json" else "model_providers"]["mlx-kit"]) \
            == fingerprint(ours["provider" if fmt == "json" else "model_providers"]["mlx-kit"])
    for line in user.splitlines():  # every comment of the user's survives the merge
        if "#" in line and "local" not in line:
            assert line.split("#", 1)[1] in merged
    back, _ = unmerge(spec, merged, record, "f")
    before = loads(fmt, user, "f") if user.strip() else None
    after = loads(fmt, back, "f")
    empty_doc = [] if fmt == "yaml" else {}
    # the user's document comes back: their entries, and their own values of ours
    assert fingerprint(after or empty_doc) == fingerprint(before or empty_doc)


def test_an_entry_the_user_edited_is_not_removed_without_force():
    merged, record = merge(YAML_LIST, "- model_id: a\n", OURS["yaml"], "f")
    edited = merged.replace('"http://127.0.0.1:8090/v1"', '"http://10.0.0.1/v1"')
    with pytest.raises(HarnessError) as exc:
        unmerge(YAML_LIST, edited, record, "f")
    assert "edited" in exc.value.message
    back, _ = unmerge(YAML_LIST, edited, record, "f", force=True)
    assert "local" not in back


def test_a_file_that_does_not_parse_is_left_alone():
    with pytest.raises(HarnessError) as exc:
        merge(YAML_LIST, "- model_id: [unclosed\n", OURS["yaml"], "models.yaml")
    assert "not valid YAML" in exc.value.message


def test_wrong_shape_is_refused():
    with pytest.raises(HarnessError):
        merge(YAML_LIST, "model_id: not-a-list\n", OURS["yaml"], "f")


def test_emptied_parents_we_created_are_dropped_but_the_users_stay():
    merged, record = merge(JSON_KEYS, '{"provider": {"x": {}}}', OURS["json"], "f")
    back, _ = unmerge(JSON_KEYS, merged, record, "f")
    assert loads("json", back, "f") == {"provider": {"x": {}}}
    merged, record = merge(JSON_KEYS, '{"theme": 1}', OURS["json"], "f")
    back, _ = unmerge(JSON_KEYS, merged, record, "f")
    assert loads("json", back, "f") == {"theme": 1}


def test_a_value_of_the_users_that_we_replaced_comes_back_on_removal():
    """Install over the user's own `local` entry / provider key, then the user edits
    something else: removal restores their value, not just deletes ours."""
    user = "- model_id: local\n  model_name: my-own-local\n- model_id: b\n  model_name: c\n"
    merged, record = merge(YAML_LIST, user, OURS["yaml"], "f")
    merged = merged.replace("model_name: c", "model_name: changed-later")
    back, _ = unmerge(YAML_LIST, merged, record, "f")
    doc = loads("yaml", back, "f")
    assert [dict(e) for e in doc] == [{"model_id": "local", "model_name": "my-own-local"},
                                      {"model_id": "b", "model_name": "changed-later"}]

    user = '{"provider": {"mlx-kit": {"name": "hand-made"}}, "theme": "dark"}'
    merged, record = merge(JSON_KEYS, user, OURS["json"], "f")
    merged = merged.replace('"dark"', '"light"')
    back, _ = unmerge(JSON_KEYS, merged, record, "f")
    assert loads("json", back, "f") == {"provider": {"mlx-kit": {"name": "hand-made"}},
                                        "theme": "light"}
