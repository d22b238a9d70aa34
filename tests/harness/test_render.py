"""Rendering agent configs: hostile model names and URLs land in the generated file as
inert literals, the file loads in the real pi, and malformed specs are refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import json5
import pytest

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness.render import MARKER, context, js_literal, render
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.helpers import clean_env, edited_spec, require_binary

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HOSTILE = [
    'double "quotes" here',
    "single 'quotes' here",
    "back\\slash \\\" \\n",
    "new\nline\r\nand carriage\rreturn",
    "ends a comment */ starts one /*",
    "</script><script>alert(1)</script>",
    "${process.exit(7)} and `backticks`",
    "line\u2028separator\u2029paragraph",
    "nul\x00byte and escape\x1b[31m",
    "emoji 🦙🚀 and é",
]
EVERYTHING = "".join(HOSTILE)
LINE_BREAKS = ("\n", "\r", "\u2028", "\u2029")


def _models(text: str) -> list[dict]:
    caps = {"tools": True, "reasoning": False, "vision": False}
    return [
        {"id": "local", "name": text, "model": text, "context_window": 32768,
         "max_tokens": 4096, "capabilities": caps},
        {"id": text, "name": text, "model": text, "context_window": 32768,
         "max_tokens": 4096, "capabilities": caps},
    ]


def _const(text: str, prefix: str) -> str:
    """The literal of the one line ``<prefix><literal>;`` in a rendered file."""
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting with {prefix!r}, got {lines}"
    assert lines[0].endswith(";")
    return lines[0][len(prefix):-1]


def _render_pi(base_url: str, models: list[dict], source: str = "test") -> str:
    spec = load_spec("pi")
    out = render(spec, context(base_url, models, source))
    assert list(out) == [f.path for f in spec.files]
    return out[spec.files[0].path]


# --- js_literal -------------------------------------------------------------------------

@pytest.mark.parametrize("value", HOSTILE + [EVERYTHING], ids=range(len(HOSTILE) + 1))
def test_js_literal_round_trips_hostile_strings(value):
    literal = js_literal(value)
    assert json.loads(literal) == value
    for ch in LINE_BREAKS + ("\x00",):
        assert ch not in literal
    assert literal.isascii()
    assert "</" not in literal  # cannot close a <script> block either


def test_js_literal_round_trips_nested_values():
    value = {"models": _models(EVERYTHING), EVERYTHING: [EVERYTHING, None, True, 1.5]}
    literal = js_literal(value)
    assert json.loads(literal) == value
    assert "\n" not in literal and "\u2028" not in literal


# --- the pi template ----------------------------------------------------------------------

def test_rendered_pi_extension_keeps_hostile_models_as_data():
    models = _models(EVERYTHING)
    text = _render_pi("http://127.0.0.1:8090/v1", models)

    assert MARKER in text.splitlines()[0]
    baked = _const(text, "const BAKED_MODELS: ServerModel[] = ")
    assert json.loads(baked) == models
    assert json.loads(_const(text, "const BASE_URL = ")) == "http://127.0.0.1:8090/v1"
    assert json.loads(_const(text, "const PROVIDER = ")) == "mlx-kit"
    for ch in LINE_BREAKS[1:] + ("\x00",):
        assert ch not in text
    # A hostile name adds no line: the file has the same shape as with a plain name.
    plain = _render_pi("http://127.0.0.1:8090/v1", _models("plain"))
    assert len(text.splitlines()) == len(plain.splitlines())


def test_rendered_base_url_round_trips():
    url = parse_url("http://[::1]:9123/v1/").v1
    assert json.loads(_const(_render_pi(url, _models("m")), "const BASE_URL = ")) == url
    nasty = 'http://127.0.0.1:1/v1"; process.exit(1); //\n`${x}`'
    assert json.loads(_const(_render_pi(nasty, _models("m")), "const BASE_URL = ")) == nasty


@pytest.mark.agent
def test_real_pi_loads_the_installed_extension_with_hostile_models(home, dead_url, monkeypatch):
    """pi starts, with nothing listening at the URL, and lists mlx-kit/local from the baked
    list even though model names and ids hold quotes, newlines, U+2028 and template syntax."""
    pi = require_binary("pi")
    models = _models(EVERYTHING)
    monkeypatch.setattr(hi, "baked_models", lambda url: (models, "hostile test entries"))

    result = hi.install(load_spec("pi"), parse_url(dead_url))
    target = home / ".pi" / "agent" / "extensions" / "mlx-kit.ts"
    assert result.written == [target]
    on_disk = target.read_text(encoding="utf-8")
    assert json.loads(_const(on_disk, "const BAKED_MODELS: ServerModel[] = ")) == models

    r = subprocess.run([pi, "--list-models"], env=clean_env(home), cwd=home,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in (r.stdout + r.stderr).splitlines()]  # 1.x: stdout
    local = [row for row in rows if row[:2] == ["mlx-kit", "local"]]
    assert len(local) == 1, r.stdout + r.stderr
    assert "32.8K" in local[0]  # the baked context window, not a default


# --- spec validation ------------------------------------------------------------------

def test_the_shipped_pi_spec_parses(tmp_path):
    spec = parse_spec(*edited_spec("pi", lambda t: t))
    assert (spec.name, spec.binary) == ("pi", "pi")
    assert [f.template for f in spec.files] == ["pi/mlx-kit.ts.j2"]
    assert spec.launch_args == ("--provider", "mlx-kit", "--model", "local")


@pytest.mark.parametrize("edit, message", [
    (lambda t: 'colour = "blue"\n' + t, "agent.toml: colour: unknown key"),
    (lambda t: t.replace('template = "pi/mlx-kit.ts.j2"', 'template = "pi/nope.ts.j2"'),
     "files[0].template: template 'pi/nope.ts.j2' not found"),
    (lambda t: t.replace('template = "pi/mlx-kit.ts.j2"\n', ""),
     "files[0].template: required key missing"),
    (lambda t: t.replace('mode = "drop-in"', 'mode = "drop-in"\ncolour = "blue"'),
     "files[0].colour: unknown key"),
    (lambda t: t.replace('mode = "drop-in"', 'mode = "symlink"'),
     "files[0].mode: must be 'drop-in' or 'merge' (got 'symlink')"),
    (lambda t: t.replace('binary = "pi"\n', ""), "agent.toml: binary: required key missing"),
], ids=["unknown-top-key", "template-file-missing", "template-key-missing",
        "unknown-file-key", "bad-mode", "binary-missing"])
def test_malformed_spec_is_refused(tmp_path, edit, message):
    data, where = edited_spec("pi", edit)
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, where)
    assert message in exc.value.message
    assert exc.value.message.startswith("agent.toml")


def test_baked_source_with_line_separators_stays_inside_a_string():
    """Regression: the bake source used to go into a // comment, where U+2028 or \\r would
    end the comment and turn the rest of the line into code."""
    source = "probe of x\u2028globalThis.pwned = 1;\r// y\n"
    text = render(load_spec("pi"), context("http://127.0.0.1:1/v1", [], source))["extensions/mlx-kit.ts"]
    line = next(ln for ln in text.splitlines() if ln.startswith("const BAKED_FROM = "))
    assert json.loads(line.removeprefix("const BAKED_FROM = ").removesuffix(";")) == source
    assert "\u2028" not in text and "\r" not in text


# --- found by the property tests (tests/harness/test_properties.py) -----------------------

def test_a_codex_profile_for_a_model_named_beyond_the_bmp_is_valid_toml():
    """js wrote 🦙 as the JSON surrogate pair \\ud83e\\udd99, which TOML refuses ("not a
    Unicode scalar value"): Codex could not load the profile. The toml filter writes it."""
    name = "🦙 llama\u2028𐀀\x7f\"\\"
    text = render(load_spec("codex"), context("http://127.0.0.1:1/v1", _models(name), "t"))[
        "mlx-kit.config.toml"]
    profile = tomllib.loads(text)
    assert profile["model_providers"]["mlx-kit"]["name"] == f"mlx-kit (local MLX server: {name})"
    assert "\u2028" not in text and "\x7f" not in text


def test_codex_profile_names_a_catalog_with_the_local_models_window():
    """Codex 0.171 warned "Model metadata for `local` not found. Defaulting to fallback
    metadata" on every run: the profile now names a catalog file (a relative path, read
    from the profile's folder) whose one entry is `local`, with the served model's window,
    text-only input and instructions; hostile model names stay inert JSON strings."""
    files = render(load_spec("codex"), context("http://127.0.0.1:1/v1", _models(EVERYTHING),
                                               "t"))
    profile = tomllib.loads(files["mlx-kit.config.toml"])
    assert profile["model_catalog_json"] == "mlx-kit.models.json"
    assert profile["model_context_window"] == 32768
    (entry,) = json.loads(files["mlx-kit.models.json"])["models"]
    assert entry["slug"] == entry["display_name"] == "local"
    assert entry["description"] == EVERYTHING
    assert entry["context_window"] == entry["max_context_window"] == 32768
    assert entry["input_modalities"] == ["text"]
    assert EVERYTHING in entry["base_instructions"]
    assert MARKER in files["mlx-kit.models.json"][:300]  # where removal looks for it


@pytest.mark.agent
def test_real_codex_reads_the_installed_catalog(home, dead_url, monkeypatch):
    """The real Codex parses the catalog we write (a missing key is a parse error in 0.171)
    and lists `local` from it with the served window, not its 272,000-token fallback."""
    codex = require_binary("codex")
    monkeypatch.setattr(hi, "baked_models", lambda url: (_models(EVERYTHING), "test"))
    hi.install(load_spec("codex"), parse_url(dead_url))
    catalog = home / ".codex" / "mlx-kit.models.json"
    r = subprocess.run([codex, "debug", "models", "-c",
                        f"model_catalog_json={json.dumps(str(catalog))}"],
                       env=clean_env(home), cwd=home, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    (entry,) = json.loads(r.stdout)["models"]
    assert (entry["slug"], entry["context_window"]) == ("local", 32768)

@pytest.mark.parametrize("agent", ["opencode", "kilo"])
def test_opencode_does_not_expand_env_or_file_references_in_a_model_name(agent):
    """opencode (and Kilo, its fork: the same code in its binary) replaces {env:VAR} and
    {file:path} in its config's raw text before parsing it: a model named "{file:x}"
    stopped it from loading the file ("bad file reference"), "{env:VAR}" put the
    variable's value in (unescaped: a quote broke the JSON). Values from the server are
    written with "{" escaped; our own {env:MLX_KIT_API_KEY} stays."""
    name = "m {env:HOME} {file:/nonexistent} ${x}"
    url = "http://127.0.0.1:1/{env:PATH}/v1"
    [text] = render(load_spec(agent), context(url, _models(name), "t")).values()
    assert re.findall(r"\{(?:env|file):[^}]*\}", text) == ["{env:MLX_KIT_API_KEY}"]
    provider = json5.loads(text)["provider"]["mlx-kit"]
    assert provider["models"]["local"]["name"] == f"local ({name})"
    assert provider["options"] == {"baseURL": url, "apiKey": "{env:MLX_KIT_API_KEY}"}


def test_js_literal_escapes_extra_characters_only_inside_strings():
    value = {"k{": ["{env:X}", 1, None, True], "n": "}{"}
    literal = js_literal(value, "{")
    assert json.loads(literal) == value
    assert literal.count("{") == 1 and literal.startswith("{")  # the object's own brace
    assert js_literal("{x}", "{") == '"\\u007bx}"'
    assert js_literal(value) == json.dumps(value)


@pytest.mark.parametrize("window, max_tokens, small", [(8192, 2048, True), (32768, 4096, False),
                                                         (131072, 32768, False)])
def test_claude_settings_fit_claude_codes_thresholds_to_the_window(window, max_tokens, small):
    """Claude Code 2.1.332 auto-compacts at window - min(output, 20000) - 13000 tokens and
    refuses to send at window - min(output, 20000) - 3000: on the starter's 8,192 it would
    compact before every answer and refuse the second turn. A small window turns
    auto-compaction off and moves the refusal to window - output (what the server accepts);
    every window drops the billing-header block that defeats the prompt cache."""
    caps = {"tools": True, "reasoning": False, "vision": False}
    models = [{"id": "local", "name": "m", "model": "m", "context_window": window,
               "max_tokens": max_tokens, "capabilities": caps}]
    env = json.loads(render(load_spec("claude"), context("http://127.0.0.1:1/v1", models, "t"))[
        "mlx-kit.settings.json"])["env"]
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(window)
    if small:
        assert env["DISABLE_AUTO_COMPACT"] == "1"
        assert env["CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE"] == str(window - max_tokens)
    else:
        assert "DISABLE_AUTO_COMPACT" not in env
        assert "CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE" not in env
