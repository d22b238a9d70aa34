"""Merging our entries into users' shared config files and taking them out again, by keys:
every other key, comment and byte stays; removal restores the file."""

from __future__ import annotations

import json

import pytest

from kit.errors import HarnessError
from kit.harness.formats import loads
from kit.harness.merge import (MergeSpec, fingerprint, list_selector, merge, merged_again,
                               owned_fingerprints, unmerge)

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


# --- entries of a list inside a mapping, plus owned keys (Qwen Code's settings.json) ------

LIST_IN_MAPPING = MergeSpec("json", "keys", owns=("providers.openai[id]", "auth.type",
                                                  "model.name"))
LIST_OURS = ('{"providers": {"openai": [{"id": "local", "baseUrl": "http://127.0.0.1:8090/v1"}]},'
             ' "auth": {"type": "openai"}, "model": {"name": "local"}}')


@pytest.mark.parametrize("user", [
    None,
    '{}\n',
    '{\n  "theme": "dark",\n  "$version": 4\n}\n',
    '{"providers": {"openai": [{"id": "mine", "baseUrl": "https://example.invalid/v1"}],'
    ' "anthropic": [{"id": "claude"}]}, "auth": {"type": "oauth", "extra": 1},'
    ' "model": {"name": "mine", "temperature": 0.2}}\n',
    '{"providers": {"openai": [{"id": "local", "baseUrl": "http://my-own/v1"},'
    ' {"id": "b"}]}}\n',
    '{"providers": {"openai": []}, "model": {}}\n',
], ids=["no-file", "empty", "other-keys", "own-providers-and-values", "own-local-entry",
        "empty-containers"])
def test_list_entries_inside_a_mapping_merge_and_come_out_by_key(user):
    merged, record = merge(LIST_IN_MAPPING, user, LIST_OURS, "settings.json")
    doc = loads("json", merged, "f")
    ours = loads("json", LIST_OURS, "ours")
    [entry] = [e for e in doc["providers"]["openai"] if e["id"] == "local"]
    assert entry == ours["providers"]["openai"][0]
    assert doc["auth"]["type"] == "openai" and doc["model"]["name"] == "local"
    assert set(record["entries"]) == {"providers.openai[id=local]", "auth.type", "model.name"}
    before = loads("json", user or "", "f") or {}
    for e in (before.get("providers") or {}).get("openai", []):  # the user's others stay
        if e["id"] != "local":
            assert e in doc["providers"]["openai"]

    back, is_empty = unmerge(LIST_IN_MAPPING, merged, record, "settings.json")
    assert loads("json", back, "f") == before  # the user's document, their values back
    assert is_empty == (before == {})


def test_the_list_and_parents_we_created_go_once_empty_but_the_users_own_stay():
    merged, record = merge(LIST_IN_MAPPING, '{"providers": {}}', LIST_OURS, "f")
    assert "providers.openai" in record["created"] and "providers" not in record["created"]
    back, _ = unmerge(LIST_IN_MAPPING, merged, record, "f")
    assert loads("json", back, "f") == {"providers": {}}
    # a user entry added to the list we created keeps the list
    doc = loads("json", merged, "f")
    doc["providers"]["openai"].append({"id": "added-later"})
    back, _ = unmerge(LIST_IN_MAPPING, json.dumps(doc), record, "f")
    assert loads("json", back, "f") == {"providers": {"openai": [{"id": "added-later"}]}}


def test_removal_by_key_survives_the_agent_rewriting_the_file():
    """The agent reformats the file, reorders nothing, adds its own key: removal still
    finds our entries by key and leaves the agent's key and the user's values."""
    user = '{"model": {"name": "mine"}, "providers": {"openai": [{"id": "mine"}]}}\n'
    merged, record = merge(LIST_IN_MAPPING, user, LIST_OURS, "f")
    doc = loads("json", merged, "f")
    doc["$version"] = 4
    rewritten = json.dumps(doc, indent=4)  # other indentation, no trailing newline
    back, _ = unmerge(LIST_IN_MAPPING, rewritten, record, "f")
    assert loads("json", back, "f") == {"model": {"name": "mine"},
                                        "providers": {"openai": [{"id": "mine"}]},
                                        "$version": 4}


def test_an_edited_list_entry_is_not_removed_without_force_and_drift_sees_it():
    merged, record = merge(LIST_IN_MAPPING, '{"providers": {"openai": [{"id": "mine"}]}}',
                           LIST_OURS, "f")
    assert owned_fingerprints(LIST_IN_MAPPING, loads("json", merged, "f"), record) == \
        record["entries"]
    edited = merged.replace("http://127.0.0.1:8090/v1", "http://10.0.0.1/v1")
    assert owned_fingerprints(LIST_IN_MAPPING, loads("json", edited, "f"), record) != \
        record["entries"]
    with pytest.raises(HarnessError) as exc:
        unmerge(LIST_IN_MAPPING, edited, record, "settings.json")
    assert "the entry id=local of providers.openai in settings.json was edited" \
        in exc.value.message
    back, _ = unmerge(LIST_IN_MAPPING, edited, record, "f", force=True)
    assert loads("json", back, "f") == {"providers": {"openai": [{"id": "mine"}]}}


@pytest.mark.parametrize("user, where", [
    ('{"providers": {"openai": {"id": "local"}}}', "providers.openai in f should hold a list"),
    ('{"providers": "none"}', "providers in f should hold a mapping"),
    ('{"model": "a-legacy-string"}', "model in f should hold a mapping"),
])
def test_a_users_value_of_another_shape_is_never_replaced(user, where):
    with pytest.raises(HarnessError) as exc:
        merge(LIST_IN_MAPPING, user, LIST_OURS, "f")
    assert where in exc.value.message


@pytest.mark.parametrize("owned", ["a.b[", "a.b[id", "a[b]c", "[id]", "a.b[x.y]", "a.b[]"])
def test_a_malformed_list_selector_is_refused(owned):
    with pytest.raises(HarnessError):
        list_selector(owned)
    assert list_selector("modelProviders.openai[id]") == (["modelProviders", "openai"], "id")
    assert list_selector("model.name") is None


def test_a_plain_value_set_again_since_install_is_the_users_and_stays():
    """The user picks another model inside the agent (which writes model.name): removal
    keeps that choice instead of refusing or putting back the value from before install."""
    merged, record = merge(LIST_IN_MAPPING, '{"model": {"name": "before"}}', LIST_OURS, "f")
    doc = loads("json", merged, "f")
    doc["model"]["name"] = "picked-later"
    back, _ = unmerge(LIST_IN_MAPPING, json.dumps(doc), record, "f")
    assert loads("json", back, "f") == {"model": {"name": "picked-later"}}


def test_merging_again_over_our_own_entries_keeps_what_the_first_merge_found():
    user = '{"model": {"name": "mine"}, "providers": {"openai": [{"id": "local", "x": 1}]}}'
    merged, first = merge(LIST_IN_MAPPING, user, LIST_OURS, "f")
    again_text, again = merge(LIST_IN_MAPPING, merged, LIST_OURS.replace("8090", "9000"), "f")
    assert again["previous"]["model.name"] == "local"  # what merge alone believes
    record = merged_again(first, again)
    assert record["previous"] == first["previous"] and record["created"] == first["created"]
    assert record["entries"] == again["entries"]
    back, _ = unmerge(LIST_IN_MAPPING, again_text, record, "f")
    assert loads("json", back, "f") == loads("json", user, "f")


# --- found by the property tests (tests/harness/test_properties.py) -----------------------

def test_a_later_entry_of_the_users_with_our_key_stays_theirs_on_removal():
    """Ours replaces the first entry with our key; removal took every entry with that key
    for ours: a second one of the user's was refused as "edited", or, when it equalled
    ours, overwritten with the first one's value (written as a YAML alias)."""
    user = "- model_id: local\n  model_name: first\n- model_id: local\n  model_name: second\n"
    merged, record = merge(YAML_LIST, user, OURS["yaml"], "f")
    back, _ = unmerge(YAML_LIST, merged, record, "f")
    assert back == user

    user = "- model_id: local\n  model_name: mine\n" + OURS["yaml"]
    merged, record = merge(YAML_LIST, user, OURS["yaml"], "f")
    back, _ = unmerge(YAML_LIST, merged, record, "f")
    assert loads("yaml", back, "f") == loads("yaml", user, "f") and "*" not in back


def test_a_file_of_only_comments_keeps_them_above_our_entry():
    """A list whose entries are all commented out holds no document: the comments used to
    vanish from the file while our entry was in it."""
    user = "# my models, off for now\n# - model_id: gpt-4o-mini\n#   model_name: x\n"
    merged, record = merge(YAML_LIST, user, OURS["yaml"], "f")
    assert merged.startswith(user)
    assert [e["model_id"] for e in loads("yaml", merged, "f")] == ["local"]
    back, is_empty = unmerge(YAML_LIST, merged, record, "f")
    assert is_empty and user in back


def test_a_users_value_with_a_nel_character_comes_back_unchanged():
    """ruamel writes a plain string holding U+0085 single-quoted, where NEL reads back as a
    space: the user's value put back on removal changed."""
    user = '- model_id: local\n  model_name: "a\\Nb"\n- model_id: other\n'
    merged, record = merge(YAML_LIST, user, OURS["yaml"], "f")
    record = json.loads(json.dumps(record))  # as the manifest keeps it: plain strings
    merged = merged.replace("model_id: other", "model_id: edited-since")  # no byte restore
    back, _ = unmerge(YAML_LIST, merged, record, "f")
    assert loads("yaml", back, "f")[0]["model_name"] == "a\x85b"
