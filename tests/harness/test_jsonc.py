"""The JSONC editor (kit/harness/jsonc.py): setting and deleting values by key path keeps
every other byte of the file — comments, trailing commas, indentation, line endings — and
adding a member then deleting it gives the original bytes back."""

from __future__ import annotations

import json

import json5
import pytest

from kit.errors import HarnessError
from kit.harness import jsonc
from kit.harness.formats import dumps, empty, loads

VALUE = {"api_url": "http://127.0.0.1:8090/v1",
         "available_models": [{"name": "local", "max_tokens": 8192, "max_output_tokens": 2048,
                               "capabilities": {"tools": True, "images": False}}]}

DOCS = {
    "comments-and-trailing-commas": """\
// Zed settings
//
// For information on how to configure Zed, see the Zed docs.
{
  "theme": "One Dark", /* a block comment */
  "ui_font_size": 16,
  "language_models": {
    "openai_compatible": {
      // my own provider
      "Together": {
        "api_url": "https://api.together.xyz/v1",
        "available_models": [
          {"name": "x", "max_tokens": 1000,}, // trailing
        ],
      },
    },
  },
  "vim_mode": true, // I like vim
}
""",
    "no-trailing-commas-comment-after-last": """\
{
    "theme": "Ayu",
    "language_models": {
        "openai_compatible": {
            "Other": {"api_url": "http://x/v1", "available_models": []} // mine
        }
    }
}
""",
    "tabs": '{\n\t"theme": "x",\n\t"language_models": {\n\t\t"openai_compatible": {}\n\t}\n}\n',
    "crlf": '{\r\n  "a": 1,\r\n  "language_models": {\r\n    "openai_compatible": {\r\n'
            '      "b": 2\r\n    }\r\n  }\r\n}\r\n',
    "inline": '{"theme": "x", "language_models": {"openai_compatible": {"o": 1}}}',
    "empty-with-note": '{\n  "language_models": {\n    "openai_compatible": {\n'
                       '      // providers go here\n    }\n  }\n}\n',
    "json5-isms": "{\n  theme: 'x', // unquoted key, single quotes\n  n: 0x1F,\n"
                  "  language_models: {openai_compatible: {a: +1,},},\n}\n",
    "no-final-newline": '{\n  "language_models": {\n    "openai_compatible": {\n'
                        '      "z": true\n    }\n  }\n}',
}
PATH = ["language_models", "openai_compatible", "mlx-kit"]


def _at(data, path):
    for part in path:
        data = data[part]
    return data


@pytest.mark.parametrize("name", sorted(DOCS))
def test_insert_then_delete_gives_the_original_bytes_back(name):
    text = DOCS[name]
    view = jsonc.load(text)
    before = json5.loads(text)
    _at(view, PATH[:-1])[PATH[-1]] = VALUE
    edited = jsonc.dump(view)

    data = json5.loads(edited)
    assert _at(data, PATH) == VALUE
    _at(data, PATH[:-1]).pop(PATH[-1])
    assert data == before  # nothing else changed in value...
    if name not in ("inline", "json5-isms", "tabs"):  # ...nor in text: every line of the
        # user's is still there (the one before ours may have gained a comma); an empty or
        # inline container is rewritten around the new member
        assert all(line.replace(",", "") in edited.replace(",", "")
                   for line in text.splitlines())
    assert ("\r\n" in edited) == ("\r\n" in text)
    if "\r\n" in text:
        assert "\n" not in edited.replace("\r\n", "")  # no mixed line endings

    del _at(view, PATH[:-1])[PATH[-1]]
    assert jsonc.dump(view) == text


def test_a_new_member_takes_the_indentation_and_comma_style_of_its_siblings():
    view = jsonc.load(DOCS["comments-and-trailing-commas"])
    view["language_models"]["openai_compatible"]["mlx-kit"] = {"a": 1}
    assert ('      },\n      "mlx-kit": {\n        "a": 1\n      },\n    },\n'
            in jsonc.dump(view))  # trailing-comma file: ours has one too

    view = jsonc.load(DOCS["no-trailing-commas-comment-after-last"])
    view["language_models"]["openai_compatible"]["mlx-kit"] = {"a": 1}
    assert ('"available_models": []}, // mine\n            "mlx-kit": {\n'
            '                "a": 1\n            }\n        }' in jsonc.dump(view))

    view = jsonc.load(DOCS["inline"])
    view["language_models"]["openai_compatible"]["mlx-kit"] = {"a": [1, 2]}
    assert jsonc.dump(view) == ('{"theme": "x", "language_models": {"openai_compatible": '
                                '{"o": 1, "mlx-kit": {"a": [1, 2]}}}}')


def test_parents_are_created_and_dropped_in_place():
    text = '// mine\n{\n  "theme": "x"\n}\n'
    view = jsonc.load(text)
    view["language_models"] = {}
    view["language_models"]["openai_compatible"] = {}
    view["language_models"]["openai_compatible"]["mlx-kit"] = {"a": 1}
    assert jsonc.dump(view) == ('// mine\n{\n  "theme": "x",\n  "language_models": {\n'
                                '    "openai_compatible": {\n      "mlx-kit": {\n'
                                '        "a": 1\n      }\n    }\n  }\n}\n')
    del view["language_models"]["openai_compatible"]["mlx-kit"]
    assert jsonc.dump(view).count("{}") == 1  # an emptied object collapses to {}
    del view["language_models"]
    assert jsonc.dump(view) == text


def test_replacing_a_value_keeps_the_comments_around_it():
    text = '{\n  // before\n  "a": {"old": true}, // after\n  "b": 2,\n}\n'
    view = jsonc.load(text)
    view["a"] = {"new": [1]}
    out = jsonc.dump(view)
    assert out == ('{\n  // before\n  "a": {\n    "new": [\n      1\n    ]\n  }, // after\n'
                   '  "b": 2,\n}\n')
    view["a"] = {"old": True}
    assert json5.loads(jsonc.dump(view)) == json5.loads(text)


def test_arrays_are_edited_by_index():
    text = '{\n  "list": [\n    1, // one\n    2,\n  ],\n  "x": []\n}\n'
    view = jsonc.load(text)
    view["list"].append({"id": "local"})
    view["x"].append("a")
    assert json5.loads(jsonc.dump(view)) == {"list": [1, 2, {"id": "local"}], "x": ["a"]}
    del view["list"][2]
    view["x"].pop()
    assert jsonc.dump(view) == text.replace('"x": []', '"x": []')
    view["list"][0] = 10
    assert json5.loads(jsonc.dump(view))["list"] == [10, 2]
    assert "// one" in jsonc.dump(view)
    with pytest.raises(NotImplementedError):
        view["list"].insert(0, 5)


@pytest.mark.parametrize("hostile", [
    'double "quotes"', "back\\slash", "new\nline\r\n", "ends a comment */ // not one",
    "line\u2028separator", "nul\x00byte", "emoji 🦙 é",
])
def test_hostile_keys_and_values_stay_data(hostile):
    view = jsonc.load('{\n  "a": 1 // c\n}\n')
    view[hostile] = {hostile: [hostile]}
    out = jsonc.dump(view)
    assert json5.loads(out) == {"a": 1, hostile: {hostile: [hostile]}}
    assert json.loads(out.replace("// c", "")) == json5.loads(out)  # and it is plain JSON
    assert "\u2028" not in out
    del view[hostile]
    assert jsonc.dump(view) == '{\n  "a": 1 // c\n}\n'


def test_duplicate_keys_the_last_one_counts_and_delete_removes_all():
    view = jsonc.load('{"a": 1, "a": 2}')
    assert view["a"] == 2
    view["a"] = 3
    assert json5.loads(jsonc.dump(view)) == {"a": 3}
    del view["a"]
    assert json5.loads(jsonc.dump(view)) == {}


def test_a_file_of_comments_only_becomes_an_object_after_them():
    view = jsonc.load("// nothing yet\n")
    view["a"] = 1
    assert jsonc.dump(view) == '// nothing yet\n{\n  "a": 1\n}\n'


@pytest.mark.parametrize("bad", ['{"a": }', '{"a": 1 "b": 2}', '{"a": 1', "{'a': \u0001}"])
def test_text_that_does_not_parse_is_refused_with_a_place(bad):
    with pytest.raises(HarnessError) as exc:
        loads("jsonc", bad, "settings.json")
    assert exc.value.message.startswith("settings.json is not valid JSONC")


def test_the_format_functions():
    assert loads("jsonc", "  \n", "f") is None
    doc = empty("jsonc", "mapping")
    doc["k"] = "v"
    assert dumps("jsonc", doc) == '{\n  "k": "v"\n}\n'
    lst = empty("jsonc", "list")
    lst.append({"model_id": "local"})
    assert json.loads(dumps("jsonc", lst)) == [{"model_id": "local"}]
    # views compare and copy as the plain data they hold
    view = loads("jsonc", '{"a": {"b": [1]}}', "f")
    assert view == {"a": {"b": [1]}} and type(view.copy()) is dict


def test_escaped_surrogate_pairs_are_one_character():
    """json-five decodes "\\ud83e\\udd99" as two lone surrogates; the view joins them (a lone
    surrogate could not even be written back as UTF-8)."""
    view = jsonc.load('{"a": "\\ud83e\\udd99", "\\ud83d\\ude80": 1}')
    assert view == {"a": "🦙", "🚀": 1}
    view["b"] = view["a"] + "\ud800"  # a lone one is written escaped
    out = jsonc.dump(view)
    out.encode("utf-8")
    assert json.loads(out)["b"] == "🦙\ud800"
