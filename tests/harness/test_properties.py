"""Property tests with generated user configs: for every agent whose spec merges into a
file the user shares with us (llm's YAML list by model_id, Qwen's JSON keys and list entries
by id, the JSONC agents), hypothesis writes the user's file — nested mappings and lists of
strings, ints, bools and nulls, unicode keys and values, entries of their own shaped like
ours under other ids or under ours, YAML comments and quoting styles, JSON indentations and
line endings, JSONC comments and trailing commas — and install/remove through the public
API on a throwaway HOME must:

(a) give back the user's file byte for byte;
(b) leave every key and entry of the user's that we do not own as it was (parsed, in order);
(c) still give back the exact bytes after installing twice (``launch`` installs each time);
(d) put back the user's own value under one of our keys (an entry ``model_id: local``),
    also when the file was edited elsewhere since, so that the exact bytes cannot be used;
(e) refuse a file whose shape is not the agent's, writing nothing;
(f) give back the user's exact bytes, and leave nothing of mlx-kit's behind, whatever
    happened to the manifest in between (deleted, truncated, garbage, stale, both
    generations gone) and whichever install/remove/reinstall sequence follows.

No agent merges into a TOML file now (Codex's profile is a file of our own). A failing
example is printed as the user's file text; ``PROPERTY_EXAMPLES=1000`` hunts longer.

And every agent's templates render generated model names (quotes, backslashes, newlines,
unicode, ``{{``, ``${``, ``{env:``...) into files that parse with their format's parser and
have the same shape as with a plain name.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import json5
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness import manifest
from kit.harness.formats import dumps, loads
from kit.harness.merge import list_selector
from kit.harness.render import context, render
from kit.harness.spec import FileSpec, HarnessSpec
from kit.harness.spec_loader import all_specs
from kit.urls import parse_url
from tests.harness.test_render import HOSTILE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPECS = all_specs()
MERGE_AGENTS = sorted(n for n, s in SPECS.items() if any(f.merge for f in s.files))
CAPS = {"tools": True, "reasoning": False, "vision": False}
MODELS = [{"id": "local", "name": "local", "model": "mlx-community/Qwen3-4B-4bit",
           "context_window": 40960, "max_tokens": 8192, "capabilities": CAPS}]
#: A second install as ``launch`` does it after the server loaded another model.
OTHER_MODELS = [dict(MODELS[0], model="org/Other-8bit", context_window=16384)]
URL, OTHER_URL = "http://127.0.0.1:8090", "http://localhost:9123"
#: What an edit made after install adds (generated keys and ids never start with it).
LATER = "zz-added-later"

#: Examples per test and agent (the JSONC agents' examples take ~0.1-0.5 s each).
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "20"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def test_the_merge_agents_are_the_ones_this_file_was_written_for():
    # YAML list by key, JSON keys + list entries, JSONC keys; no agent merges TOML now
    assert {"llm", "qwen", "zed", "crush"} <= set(MERGE_AGENTS)


# --- what we own in each agent's file ---------------------------------------------------

def plain(value: Any) -> Any:
    """Parsed YAML/JSON(C) views as plain dicts and lists (key order kept)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)  # ruamel's quoted-scalar subclasses
    return value


@functools.cache
def merge_file(agent: str) -> FileSpec:
    [fspec] = [f for f in SPECS[agent].files if f.merge]
    return fspec


def ours(agent: str) -> Any:
    """The fragment the agent's template renders (what install merges)."""
    return copy.deepcopy(_ours(agent))


@functools.cache
def _ours(agent: str) -> Any:
    fspec = merge_file(agent)
    text = render(SPECS[agent], context(URL + "/v1", MODELS, "test"))[fspec.path]
    return plain(loads(fspec.merge.format, text, "ours"))


@functools.cache
def owned(agent: str) -> list[tuple[list[str], str | None, list[str]]]:
    """Each owned place: (path, the key of a list's entries or None, our ids there). A
    list-by-key file is the list at path []."""
    m = merge_file(agent).merge
    fragment = ours(agent)
    if m.strategy == "list-by-key":
        return [([], m.key, [str(e[m.key]) for e in fragment])]
    places = []
    for item in m.owns:
        sel = list_selector(item)
        if sel is None:
            places.append((item.split("."), None, []))
        else:
            path, key = sel
            places.append((path, key, [str(e[key]) for e in get(fragment, path) or []]))
    return places


def get(doc: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def first_with(entries: Any, key: str, ident: str) -> int | None:
    if not isinstance(entries, list):
        return None
    return next((i for i, e in enumerate(entries)
                 if isinstance(e, dict) and key in e and str(e[key]) == ident), None)


def exists(doc: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def without_ours(agent: str, doc: Any, before: Any) -> Any:
    """``doc`` less what we own: the first entry with each of our ids in an owned list, the
    value at each owned key, and then the (empty) containers that ``before`` did not have."""
    doc = copy.deepcopy(doc)
    if doc is None:
        return None
    for path, key, ids in owned(agent):
        if key is not None:
            for ident in ids:
                entries = get(doc, path) if path else doc
                at = first_with(entries, key, ident)
                if at is not None:
                    del entries[at]
        else:
            parent = get(doc, path[:-1])
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
        for depth in range(len(path), 0, -1):  # parents install created, once empty
            node = get(doc, path[:depth])
            if node in ({}, []) and not exists(before, path[:depth]):
                del get(doc, path[:depth - 1])[path[depth - 1]]
    return doc


def refused(agent: str, before: Any) -> bool:
    """Whether the user's document has a shape the agent's file does not (install must
    refuse it): not a list / mapping at the top, or a value of another kind where ours go."""
    m = merge_file(agent).merge
    if before is None:
        return False
    if m.strategy == "list-by-key":
        return not isinstance(before, list)
    if not isinstance(before, dict):
        return True
    for path, key, _ in owned(agent):
        parents = path[:-1]
        for depth in range(1, len(parents) + 1):
            node = get(before, parents[:depth])
            if exists(before, parents[:depth]) and not isinstance(node, dict):
                return True
        if key is not None and exists(before, path) and not isinstance(get(before, path), list):
            return True
    return False


# --- generated user documents -----------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
KEYS = st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=10).filter(
    lambda k: k != "<<" and not k.startswith(LATER))  # "<<" is YAML's merge key
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8)
MAPPINGS = st.dictionaries(KEYS, VALUES, max_size=4)


@st.composite
def entries_like(draw, entry: dict, key: str, our_ids: list[str]) -> list:
    """A list of the user's entries: shaped like ours with other ids, their own under one of
    our ids now and then (ids of other types too), and values of other kinds."""
    other_ids = st.one_of(TEXT.filter(lambda t: t not in our_ids and not t.startswith(LATER)),
                          st.integers(0, 99), st.booleans())
    ident = st.one_of(other_ids, st.sampled_from(our_ids)) if our_ids else other_ids

    def like_ours(ident_value: Any, extra: dict, drop: list[str]) -> dict:
        mine = {k: v for k, v in copy.deepcopy(entry).items() if k not in drop}
        return {key: ident_value, **mine, **extra}

    one = st.one_of(
        st.builds(like_ours, ident, MAPPINGS, st.lists(st.sampled_from(sorted(entry)),
                                                       max_size=2)),
        st.builds(lambda i, m: {key: i, **m}, ident, MAPPINGS),
        VALUES.filter(lambda v: not isinstance(v, dict)),  # a stray value
    )
    return draw(st.lists(one, max_size=4))


@st.composite
def user_documents(draw, agent: str) -> Any:
    """A user's document for the agent's file (None: an empty file)."""
    m = merge_file(agent).merge
    fragment = ours(agent)
    shape = draw(st.sampled_from(["usual"] * 8 + ["empty", "other-shape"]))
    if shape == "empty":
        return None
    if m.strategy == "list-by-key":
        if shape == "other-shape":
            return draw(st.one_of(MAPPINGS, SCALARS.filter(lambda v: v is not None)))
        return draw(entries_like(fragment[0], m.key, [str(e[m.key]) for e in fragment]))
    doc = draw(MAPPINGS)
    for path, key, ids in owned(agent):
        depth = draw(st.integers(0, len(path)))  # how much of the path the user has
        node = doc
        for part in path[:depth - 1] if depth else []:
            if not isinstance(node.get(part), dict):
                node[part] = draw(MAPPINGS)
            node = node[part]
        if depth == 0:
            continue
        last = path[depth - 1]
        if depth < len(path):  # a parent, with siblings of their own
            if not isinstance(node.get(last), dict):
                node[last] = draw(MAPPINGS)
        elif key is not None:  # the list itself, with entries of theirs
            [entry] = [e for e in get(fragment, path) if str(e[key]) == ids[0]]
            node[last] = draw(entries_like(entry, key, ids))
        else:  # their own value under our key
            node[last] = draw(st.one_of(VALUES, st.just(copy.deepcopy(get(fragment, path)))))
    if shape == "other-shape":  # a value of another kind where the agent has a mapping
        path = draw(st.sampled_from([p for p, _, _ in owned(agent)]))
        cut = draw(st.integers(1, len(path) - 1)) if len(path) > 1 else 0
        if cut == 0:
            return draw(st.lists(VALUES, max_size=3))
        node = doc
        for part in path[:cut - 1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else None
            if node is None:
                return doc
        node[path[cut - 1]] = draw(st.one_of(TEXT, st.integers(), st.lists(SCALARS, max_size=2)))
    return doc


# --- the user's document as text ------------------------------------------------------------

COMMENT = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=16)


def _yaml_nodes(value: Any, draw) -> Any:
    """ruamel nodes for ``value``, each string quoted its own way, comments here and there,
    small collections in flow style."""
    if isinstance(value, dict):
        node = CommentedMap()
        for k, v in value.items():
            node[k] = _yaml_nodes(v, draw)
        if value and draw(st.booleans()):
            node.yaml_add_eol_comment("# " + draw(COMMENT), draw(st.sampled_from(list(value))))
        elif value and all(not isinstance(v, (dict, list)) for v in value.values()) \
                and draw(st.integers(0, 3)) == 0:
            node.fa.set_flow_style()
        return node
    if isinstance(value, list):
        node = CommentedSeq(_yaml_nodes(v, draw) for v in value)
        if value and draw(st.booleans()):
            node.yaml_add_eol_comment("# " + draw(COMMENT), draw(st.integers(0, len(value) - 1)))
        return node
    if isinstance(value, str):
        style = draw(st.sampled_from([str, SingleQuotedScalarString, DoubleQuotedScalarString]))
        return style(value)
    return value


def yaml_text(doc: Any, draw) -> str:
    if doc is None:
        return draw(st.sampled_from(["", "\n", "# all of mine commented out\n# - model_id: x\n",
                                     "   \n", "---\n"]))
    yaml = YAML()
    yaml.allow_unicode = draw(st.booleans())
    yaml.width = 4096
    yaml.indent(**draw(st.sampled_from([dict(mapping=2, sequence=2, offset=0),
                                        dict(mapping=2, sequence=4, offset=2),
                                        dict(mapping=4, sequence=6, offset=4)])))
    node = _yaml_nodes(doc, draw)
    if isinstance(node, (CommentedMap, CommentedSeq)) and node and draw(st.booleans()):
        # (a comment above an empty list makes ruamel fail)
        node.yaml_set_start_comment(draw(COMMENT) + "\n" + draw(COMMENT))
    out = io.StringIO()
    yaml.dump(node, out)
    return out.getvalue()


def json_text(doc: Any, draw, comments: bool) -> str:
    if doc is None:
        return draw(st.sampled_from(["", "\n", "  \n"]))
    indent = draw(st.sampled_from([None, 1, 2, 4, "\t"]))
    text = json.dumps(doc, indent=indent, ensure_ascii=draw(st.booleans()))
    if comments and indent is not None:
        lines = text.split("\n")
        if draw(st.booleans()):  # trailing commas, as Zed writes them
            for i in range(1, len(lines)):
                if lines[i].strip() in ("}", "]", "},", "],") and \
                        not lines[i - 1].endswith(("{", "[", ",")):
                    lines[i - 1] += ","
        for i, line in enumerate(lines):  # a comment at the end of some lines
            if line.endswith(("{", "[", ",")) and draw(st.integers(0, 2)) == 0:
                lines[i] = f"{line} // {draw(COMMENT)}"
        text = "\n".join(lines)
        if draw(st.booleans()):
            text = f"// {draw(COMMENT)}\n/* {draw(COMMENT).replace('*/', '')}\n */\n{text}"
    text += draw(st.sampled_from(["", "\n"]))
    if draw(st.integers(0, 4)) == 0:
        text = text.replace("\n", "\r\n")
    return text


@st.composite
def user_files(draw, agent: str) -> tuple[str | None, Any]:
    """(the text of the user's file, what it holds as plain data; None for no document).
    The text is None now and then: no file yet."""
    fmt = merge_file(agent).merge.format
    if draw(st.integers(0, 9)) == 0:
        return None, None
    doc = draw(user_documents(agent))
    if fmt == "yaml":
        text = yaml_text(doc, draw)
        parse = YAML(typ="safe", pure=True).load
    elif fmt in ("json", "jsonc"):
        text = json_text(doc, draw, comments=fmt == "jsonc")
        parse = lambda t: joined(json5.loads(t))  # noqa: E731
    else:  # pragma: no cover - no agent merges TOML now
        raise AssertionError(f"no generator for {fmt}")
    try:  # the generator wrote what it meant to (read by another parser than the kit's)
        parsed = plain(parse(text)) if text.strip() else None
    except Exception:  # ruamel's emitter writes a plain ":x" key in flow style: invalid
        parsed = Exception
    assume(parsed == doc)
    return text, doc


# --- install and remove on a throwaway HOME -------------------------------------------------

@pytest.fixture
def env(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A function that gives each example a fresh HOME (the agent's config dir and the
    manifest move with it) and the agent's file path there."""
    for spec in SPECS.values():
        for var in (*spec.config_dir_env, *(spec.config_dir_darwin_env or ())):
            monkeypatch.delenv(var.partition("/")[0], raising=False)
    models = {"now": MODELS}
    monkeypatch.setattr(hi, "baked_models", lambda url: (models["now"], "test entries"))

    def fresh(agent: str, text: str | None) -> tuple[HarnessSpec, Path]:
        """A new HOME holding the user's file (``text``; None: no file)."""
        monkeypatch.setenv("HOME", tempfile.mkdtemp(dir=tmp_path))
        models["now"] = MODELS
        spec = SPECS[agent]
        [path] = [p for f, p in spec.file_paths() if f.merge]
        if text is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode())
        return spec, path

    fresh.switch_models = lambda: models.update(now=OTHER_MODELS)
    return fresh


def read(fmt: str, path: Path) -> Any:
    text = path.read_bytes().decode()
    return plain(loads(fmt, text, str(path))) if text.strip() else None


def raw(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def leading_comments(text: str) -> list[str]:
    """The comments at the top of ``text`` (``#``, ``//``, ``/* */``; blank lines between
    them left out), each with the rest of its line."""
    m = re.match(r"(?:[ \t]*(?:#[^\n]*|//[^\n]*|/\*(?:[^*]|\*(?!/))*\*/[^\n]*)?\r?\n)*",
                 text)
    return [line.strip() for line in m[0].splitlines() if line.strip()]


def _install_or_refusal(spec: HarnessSpec, path: Path, text: str | None, before: Any) -> bool:
    """Install; when the document's shape is not the agent's, check that install refused
    and wrote nothing (property e). Returns whether install went ahead."""
    if refused(spec.name, before):
        with pytest.raises(HarnessError):
            hi.install(spec, parse_url(URL))
        assert raw(path) == encoded(text)
        assert spec.name not in manifest.read()["agents"]
        return False
    hi.install(spec, parse_url(URL))
    return True


@pytest.mark.parametrize("agent", MERGE_AGENTS)
@SETTINGS
@given(data=st.data())
def test_install_then_remove_gives_back_the_users_exact_bytes(agent, env, data):
    text, before = data.draw(user_files(agent), label="user's file")
    spec, path = env(agent, text)
    fmt = merge_file(agent).merge.format
    if not _install_or_refusal(spec, path, text, before):
        return

    after = read(fmt, path)
    if text is not None:  # the user's comments at the top stay there
        top = leading_comments(text)
        assert leading_comments(path.read_text())[:len(top)] == top
    # (b) everything of the user's that is not ours is as it was, in its order
    nothing = [] if isinstance(after, list) else {}
    assert without_ours(agent, after, before) == (without_ours(agent, before, before)
                                                  if before is not None else nothing)
    # ...and ours is there
    for place, key, ids in owned(agent):
        node = get(after, place) if place else after
        fragment = get(ours(agent), place) if place else ours(agent)
        if key is None:
            assert node == fragment
        for ident in ids:
            at = first_with(node, key, ident)
            assert at is not None and node[at] == fragment[first_with(fragment, key, ident)]

    hi.remove(spec)
    # (a) the user's file comes back byte for byte (no file: none, nor its folder)
    assert raw(path) == encoded(text)
    assert text is not None or not path.parent.exists()
    assert spec.name not in manifest.read()["agents"]


@pytest.mark.parametrize("agent", MERGE_AGENTS)
@SETTINGS
@given(data=st.data())
def test_installing_again_then_remove_still_gives_back_the_exact_bytes(agent, env, data):
    text, before = data.draw(user_files(agent), label="user's file")
    assume(not refused(agent, before))
    spec, path = env(agent, text)

    hi.install(spec, parse_url(URL))
    if data.draw(st.booleans(), label="server changed in between"):
        env.switch_models()
    hi.install(spec, parse_url(data.draw(st.sampled_from([URL, OTHER_URL]), label="url")))
    hi.install(spec, parse_url(OTHER_URL))
    hi.remove(spec)

    assert raw(path) == encoded(text)  # (c)


def _edited_elsewhere(fmt: str, path: Path, key: str | None) -> None:
    """The user (or the agent rewriting its file) changes something that is not ours, so
    removal cannot put back the saved bytes: a new entry, or a new key."""
    text = path.read_text()
    doc = loads(fmt, text, str(path))
    if isinstance(doc, list):
        doc.append({key: LATER})
    else:
        doc[LATER] = [1, "two", None]
    path.write_text(dumps(fmt, doc))


@pytest.mark.parametrize("agent", MERGE_AGENTS)
@SETTINGS
@given(data=st.data())
def test_the_users_value_under_our_key_comes_back_after_an_edit_elsewhere(agent, env, data):
    text, before = data.draw(user_files(agent), label="user's file")
    assume(not refused(agent, before))
    fmt, m = merge_file(agent).merge.format, merge_file(agent).merge
    spec, path = env(agent, text)
    if data.draw(st.booleans(), label="installed twice"):
        hi.install(spec, parse_url(OTHER_URL))
    hi.install(spec, parse_url(URL))
    _edited_elsewhere(fmt, path, m.key)
    if fmt == "json" and data.draw(st.booleans(), label="agent reformats"):
        path.write_text(json.dumps(json.loads(path.read_text()), indent=4))

    hi.remove(spec)

    # (d) the user's document, with the later edit: their own entries and values under
    # our keys exactly as they were (entries in their place, keys in their order)
    expected = copy.deepcopy(before)
    if m.strategy == "list-by-key":
        expected = (expected or []) + [{m.key: LATER}]
    else:
        expected = {**(expected or {}), LATER: [1, "two", None]}
    assert read(fmt, path) == expected
    assert json.dumps(read(fmt, path)) == json.dumps(expected)  # in order too


def _commented_after_install(fmt: str, path: Path, where: str, words: str) -> str:
    """The user adds one comment line to the file after install (at its top or its end),
    and nothing else. Returns the comment."""
    comment = ("// " if fmt in ("json", "jsonc") else "# ") + LATER + " " + words.strip()
    text = path.read_text()
    nl = "\r\n" if "\r\n" in text else "\n"
    if where == "top":
        path.write_text(comment + nl + text)
    else:
        path.write_text(text + ("" if text.endswith(("\n", "\r")) else nl) + comment + nl)
    return comment


@pytest.mark.parametrize("agent", [a for a in MERGE_AGENTS
                                   if merge_file(a).merge.format in ("jsonc", "yaml", "toml")])
@SETTINGS
@given(data=st.data())
def test_a_comment_the_user_added_after_install_survives_remove(agent, env, data):
    """Comments are the user's bytes: one added after install (the only edit) is still in
    the file after removal, and the content is the user's from before install."""
    text, before = data.draw(user_files(agent), label="user's file")
    assume(not refused(agent, before))
    fmt = merge_file(agent).merge.format
    spec, path = env(agent, text)
    hi.install(spec, parse_url(URL))
    comment = _commented_after_install(fmt, path, data.draw(st.sampled_from(["top", "end"])),
                                       data.draw(COMMENT.filter(lambda c: "*/" not in c)))

    hi.remove(spec)

    assert path.is_file() and comment in path.read_text()
    nothing = [] if merge_file(agent).merge.strategy == "list-by-key" else {}
    assert (read(fmt, path) or nothing) == (before if before is not None else nothing)


# --- a damaged manifest ----------------------------------------------------------------------

#: Examples per agent of the damage test (each runs up to five installs and removals).
DAMAGE_EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "15"))
#: How the manifest is damaged between install and removal: "stale" puts back the one
#: written by the first install (an older generation, or another install's).
DAMAGES = ["none", "deleted", "truncated", "garbage", "stale", "deleted-both"]
#: What happens after the damage, ending with the agent removed.
SEQUENCES = [("remove",), ("install", "remove"), ("remove", "remove"),
             ("remove", "install", "remove"), ("launch", "remove")]


def _damage(kind: str, snapshot: bytes, data) -> None:
    path, prev = manifest.manifest_path(), manifest.previous_path()
    if kind == "deleted":
        path.unlink(missing_ok=True)
    elif kind == "deleted-both":
        path.unlink(missing_ok=True)
        prev.unlink(missing_ok=True)
    elif kind == "truncated" and path.is_file():
        body = path.read_bytes()
        cut = data.draw(st.floats(0, 1, exclude_max=True), label="cut at")  # a fraction:
        path.write_bytes(body[:int(cut * len(body))])  # the length varies with tmp paths
    elif kind == "garbage":
        path.write_bytes(data.draw(st.one_of(st.binary(max_size=40), st.sampled_from(
            [b"{}", b"[]", b"null", b'{"agents": []}', b'{"agents": {"x": 1}}',
             b'{"agents": {"llm": {"files": [{"path": 3}]}}}'])), label="garbage"))
    elif kind == "stale":
        path.write_bytes(snapshot)


def _litter(home: Path) -> list[str]:
    """mlx-kit's files left in the data dir once nothing is installed (a broken manifest
    kept aside for the user is not litter)."""
    from kit.paths import data_dir

    root = data_dir()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if not p.name.startswith("manifest.json.broken-"))


@pytest.mark.parametrize("agent", MERGE_AGENTS)
@settings(max_examples=DAMAGE_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_the_users_bytes_survive_any_manifest_damage(agent, env, data):
    """(f) install, perhaps again (or removed and installed again), damage the manifest
    (deleted, truncated, garbage, stale), then remove / reinstall: the user's file comes
    back byte for byte, nothing of mlx-kit's is left behind, and no step fails."""
    text, before = data.draw(user_files(agent), label="user's file")
    assume(not refused(agent, before))
    spec, path = env(agent, text)
    hi.install(spec, parse_url(URL))
    snapshot = manifest.manifest_path().read_bytes()
    between = data.draw(st.sampled_from(["nothing", "again", "reinstalled"]), label="between")
    if between == "again":  # launch after the server loaded another model
        env.switch_models()
        hi.install(spec, parse_url(OTHER_URL))
    elif between == "reinstalled":
        hi.remove(spec)
        assert raw(path) == encoded(text)
        hi.install(spec, parse_url(OTHER_URL))
    damage = data.draw(st.sampled_from(DAMAGES), label="damage")
    _damage(damage, snapshot, data)
    for step in data.draw(st.sampled_from(SEQUENCES), label="then"):
        if step == "remove":
            hi.remove(spec)
            assert raw(path) == encoded(text)
        else:
            hi.install(spec, parse_url(URL if step == "install" else OTHER_URL))
            assert spec.name in manifest.read()["agents"]

    assert raw(path) == encoded(text)
    assert text is not None or not path.parent.exists()
    assert _litter(path) == []
    _COUNTS["damage"] += 1


_COUNTS = {"damage": 0}


def test_zz_report_damage_examples(capsys):
    """Prints how many damage examples ran in this session (for the report)."""
    with capsys.disabled():
        print(f"\n[damage property examples run: {_COUNTS['damage']}]")


# --- every agent's templates with generated model names -------------------------------------

#: Pieces that mean something in one of the formats we write, or to an agent reading it.
TRICKY = HOSTILE + ['"', "'", "\\", "\n", "\r\n", "\t", "\u2028", "\x00", "\ufeff", "{{",
                    "}}", "{%", "${", "${HOME}", "${{ secrets.X }}", "{env:HOME}",
                    "{file:/nonexistent}", "$(id)", "`id`", "*/", "/*", "//", "#", "# x",
                    "'''", '"""', "]]", "[x]", ": ", "- ", "&a", "*a", "!!python/object",
                    "%", "🦙", "é", "\x7f", "\x85"]
NAMES = st.lists(st.one_of(st.sampled_from(TRICKY), TEXT), min_size=1, max_size=5).map("".join)


def joined(value: Any) -> Any:
    """Strings with their UTF-16 surrogate pairs joined: ``js`` writes a character beyond
    U+FFFF as a pair of escapes (``\\ud83e\\udd99``), which the agents' JSON and YAML readers
    (JavaScript, Go, Rust) read as that character; json5 and ruamel keep two halves."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16")
    if isinstance(value, dict):
        return {joined(k): joined(v) for k, v in value.items()}
    if isinstance(value, list):
        return [joined(v) for v in value]
    return value


def parse_rendered(fmt: str, text: str) -> Any:
    """Parse a rendered file with its format's parser (strict JSON and TOML)."""
    if fmt == "json":
        return json.loads(text)
    if fmt == "jsonc":
        return joined(json5.loads(text))
    if fmt == "yaml":
        return joined(YAML(typ="safe", pure=True).load(text))
    if fmt == "toml":
        return tomllib.loads(text)
    raise AssertionError(fmt)


#: Patterns an agent substitutes in its config's raw text before parsing it: a model name
#: must not add any (opencode and its fork Kilo: ``{env:VAR}`` and ``{file:path}``).
RAW_SUBSTITUTIONS = {"opencode": re.compile(r"\{(?:env|file):"),
                     "kilo": re.compile(r"\{(?:env|file):")}


def file_format(fspec: FileSpec) -> str:
    if fspec.merge:
        return fspec.merge.format
    suffix = Path(fspec.path).suffix
    return {".json": "json", ".jsonc": "jsonc", ".yaml": "yaml", ".yml": "yaml",
            ".toml": "toml", ".ts": "ts"}[suffix]


def skeleton(value: Any) -> Any:
    """The document's shape: every string replaced by one placeholder."""
    if isinstance(value, dict):
        return {k: skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    return "<str>" if isinstance(value, str) else value


def strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


JS_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def ts_values(text: str) -> dict[str, Any]:
    """pi's extension: each ``const NAME[: Type] = <js literal>;`` line, parsed as JSON."""
    consts = {}
    for m in re.finditer(r"^const (\w+)(?::[^=]+)? = (.*);$", text, re.M):
        try:
            consts[m[1]] = json.loads(m[2])
        except ValueError:
            continue  # code, not a literal
    return consts


PLAIN = "plain-model-name"


def _models(name: str) -> list[dict]:
    return [dict(MODELS[0], name=name, model=name), dict(MODELS[0], id=name, name=name,
                                                         model=name)]


@pytest.mark.parametrize("agent", sorted(SPECS))
@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(name=NAMES)
def test_a_model_name_with_quotes_or_newlines_renders_safely_in_every_format(agent, name):
    spec = SPECS[agent]
    hostile = render(spec, context(URL + "/v1", _models(name), "probe of " + name))
    plain_ = render(spec, context(URL + "/v1", _models(PLAIN), "probe of " + PLAIN))
    for fspec in spec.files:
        fmt, text = file_format(fspec), hostile[fspec.path]
        assert "\x00" not in text and "\u2028" not in text
        if fmt == "ts":
            # pi: the name is only ever inside a JS literal made by the js filter, one line
            # each, and the file has the lines it has with a plain name
            consts = ts_values(text)
            assert consts["BAKED_MODELS"] == _models(name)
            assert consts["BAKED_FROM"] == "probe of " + name
            assert len(text.splitlines()) == len(plain_[fspec.path].splitlines())
            outside = JS_STRING.sub('""', text)
            assert outside == JS_STRING.sub('""', plain_[fspec.path])
            continue
        if agent in RAW_SUBSTITUTIONS:
            pattern = RAW_SUBSTITUTIONS[agent]
            assert len(pattern.findall(text)) == len(pattern.findall(plain_[fspec.path]))
        doc = parse_rendered(fmt, text)
        assert skeleton(doc) == skeleton(parse_rendered(fmt, plain_[fspec.path])), \
            f"{fspec.path}: the name changed the file's structure"
        if any(PLAIN in s for s in strings(parse_rendered(fmt, plain_[fspec.path]))):
            assert any(name in s for s in strings(doc))  # the name, as data

