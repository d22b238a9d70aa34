"""docs/troubleshooting.md stays true: every command, flag, message, path and environment
variable it names exists in the code. Model-free: the CLI tree comes from click (typer's
command object), messages from the string literals of kit/ (parsed with ``ast``), paths from
kit.paths and huggingface_hub run in a throwaway HOME.

What the doc's text is taken as (the doc's own intro says so to its writers):

- ``mlx-kit ...`` (inline code, or a line of a ``bash``/``sh`` block): a command line; each
  word names a command of the real tree, each ``-x``/``--xx`` an option of that command,
  and a value after a choice option one of its choices;
- ``-x``/``--xx`` alone: an option of some mlx-kit command;
- ``NAME_LIKE_THIS`` (or ``NAME=value``): an environment variable the code (or the library
  that reads it: huggingface_hub, platformdirs) names;
- ``snake_case_words``: an error code, field or key: a string literal of kit/;
- ``~/...``, ``$VAR/...``: a folder or file the code computes (kit.paths, the server's log
  file, the hub cache; on Linux and macOS), or ``<placeholders>`` under one;
- a message: inline code starting with ``error:``/``hint:``, inline code of 3 words or more,
  inline code in a heading, every line of a ``text`` block. It must be, whole, one string the
  code prints, or one line of one (rich markup and an ``error: ``/``hint: `` prefix taken
  off); where the code computes a part (an f-string's ``{...}``, a ``%s``), the doc holds a
  ``<placeholder>``, a string literal of kit/, the OS's text for EADDRINUSE, another message
  of the code (``{where}`` = ``"; log: {path}"``), or nothing (an empty suffix).

Each failure names the stale item and the doc line it is on.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import typer

from tests.helpers import clean_env  # the throwaway HOME every CLI run in the tests uses

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "troubleshooting.md"
WILD = "\x00"  # an f-string's {value} in a source template

_PLACEHOLDER = re.compile(r"<[^<>\n]+>")
_ENV = re.compile(r"^\$?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:=.*)?$")
_MARKUP = re.compile(r"\[/?(?:bold|dim|italic|red|green|yellow|cyan|magenta| )*\]")
_PRINTF = re.compile(r"%(?:\.\d+)?[sdfr]")
_OTHER_PROGRAMS = ("export ", "ssh ", "kill ", "hf ")  # commands of other programs
_HEADER = re.compile(r"^[A-Za-z-]+: ")  # an HTTP header line such as `Authorization: Bearer KEY`


# --- the doc ---------------------------------------------------------------------------

def doc_items(text: str) -> list[tuple[str, str, int]]:
    """``(kind, text, line number)`` for each checked item of the doc; kind is ``command``,
    ``flag``, ``env``, ``path`` or ``message``."""
    items, fence, lines = [], None, text.splitlines()
    for no, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence is not None:
            body = line.strip()
            if not body:
                continue
            if fence in ("bash", "sh", "shell"):
                command = body.removeprefix("$ ").split("  #")[0].strip()
                if command.startswith("mlx-kit "):
                    items.append(("command", command, no))
            elif fence == "text":
                items.append(("message", body, no))
            continue
        heading = line.startswith("#")
        for span in re.findall(r"`([^`\n]+)`", line):
            items.append((_classify(span.strip(), heading), span.strip(), no))
    return [i for i in items if i[0] is not None]


def _classify(span: str, heading: bool) -> str | None:
    if span.startswith("mlx-kit ") or span == "mlx-kit":
        return "command"
    if span.startswith(("error: ", "hint: ")):
        return "message"
    if span.startswith("-"):
        return "flag"
    if _ENV.match(span):
        return "env"
    if span.startswith(("~/", "$")) and "/" in span:
        return "path"
    if re.fullmatch(r"[a-z]+(?:_[a-z]+)+", span):
        return "name"
    words = len(span.split())
    if span.startswith(_OTHER_PROGRAMS) or _HEADER.match(span):
        return "env" if span.startswith("export ") else None
    if heading and words >= 2 or words >= 3:
        return "message"
    return None


# --- the CLI -----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cli_root():
    """The real command tree (typer's click objects: typer ships its own click, so the
    checks below go by attributes, not by click's classes)."""
    from kit.cli import app

    return typer.main.get_command(app)


def _options(cmd) -> dict:
    opts = {}
    for p in cmd.get_params(cmd.context_class(cmd)):
        if p.param_type_name == "option":
            for name in (*p.opts, *p.secondary_opts):
                opts[name] = p
    return opts


def _all_commands(cmd, name: str = "mlx-kit"):
    yield name, cmd
    if hasattr(cmd, "commands"):
        for sub, child in cmd.commands.items():
            yield from _all_commands(child, f"{name} {sub}")


def _choices(param) -> list[str]:
    """The values a choice option takes (click's Choice, or typer's enum), else []."""
    choices = getattr(getattr(param, "type", None), "choices", None) \
        or getattr(getattr(param, "type_descriptor", None), "choices", None) or ()
    return [str(getattr(c, "value", c)) for c in choices]


def check_command(line: str) -> str | None:
    """None if ``line`` (``mlx-kit ...``) names real commands, options and choices, else
    what is wrong."""
    words = [w.strip("[]") for w in line.split()[1:]]
    cmd, path = cli_root(), "mlx-kit"
    while hasattr(cmd, "commands") and words and not words[0].startswith("-"):
        sub = words.pop(0)
        if sub not in cmd.commands:
            return f"`{path}` has no command {sub!r}"
        cmd, path = cmd.commands[sub], f"{path} {sub}"
    opts = _options(cmd)
    for i, word in enumerate(words):
        if word == "--":
            break  # the rest goes to the agent
        for alt in word.split("|"):
            if not alt.startswith("-") or alt == "-":
                continue
            name, _, value = alt.partition("=")
            if name not in opts:
                return f"`{path}` has no option {name}"
            param = opts[name]
            if not value and not param.is_flag and i + 1 < len(words):
                value = words[i + 1]
            choices = _choices(param)
            if choices and value and not _PLACEHOLDER.search(value) and value != "..." \
                    and not value.isupper() and value not in choices:
                return f"`{path} {name}` takes {'|'.join(choices)}, not {value!r}"
    return None


def check_flag(flag: str) -> str | None:
    name = flag.split("=")[0].split()[0]
    for _path, cmd in _all_commands(cli_root()):
        if name in _options(cmd):
            return None
    return f"no mlx-kit command has the option {name}"


# --- the messages the code prints --------------------------------------------------------

def _template(node: ast.AST) -> str | None:
    """The text of a string expression with each computed part as :data:`WILD`, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _PRINTF.sub(WILD, node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else WILD for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (WILD if left is None else left) + (WILD if right is None else right)
    return None


@lru_cache(maxsize=1)
def source_strings() -> tuple[tuple[str, ...], frozenset[str]]:
    """(templates, constants): every string expression in kit/ (its lines too, with rich
    markup and an ``error: ``/``hint: `` prefix taken off), and the plain constants."""
    templates, constants = set(), set()
    for py in (ROOT / "kit").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text(), str(py))):
            t = _template(node)
            if t is None:
                continue
            if isinstance(node, ast.Constant):
                constants.add(node.value)
            t = re.sub(WILD + "+", WILD, _MARKUP.sub("", t))
            for piece in {t, *t.split("\n")}:
                piece = piece.strip()
                for prefix in ("error: ", "hint: "):
                    piece = piece.removeprefix(prefix)
                if piece.replace(WILD, "").strip():
                    templates.add(piece)
    return tuple(sorted(templates)), frozenset(constants)


_ALONE = re.compile(r"^['\"]?<[^<>]+>['\"]?$")  # a placeholder, maybe in a repr's quotes
#: characters (no spaces) of its own a template needs to explain a quote: f"{a}: {b}"
#: explains nothing (one level down, where a message's part is itself a message, fewer)
_MIN_LITERAL, _MIN_LITERAL_NESTED = 6, 4


def _value_ok(value: str, constants: frozenset[str], nested: bool) -> bool:
    """Whether the doc's text where the code computes a value is a placeholder, a string
    literal of the code, the OS's text for a port in use, or (one level down) itself a
    message of the code (``{where}`` = ``"; log: {path}"``)."""
    if not value or _ALONE.match(value) or value in constants \
            or value == os.strerror(errno.EADDRINUSE):
        return True
    return not nested and _match(value, nested=True)


def _match(quote: str, nested: bool = False) -> bool:
    templates, constants = source_strings()
    for t in templates:
        if WILD not in t:
            if t == quote:
                return True
            continue
        literal = t.split(WILD)
        if len("".join(literal).replace(" ", "")) < (_MIN_LITERAL_NESTED if nested
                                                     else _MIN_LITERAL) \
                or not all(part in quote for part in literal):
            continue  # (quick: most templates share no text with the quote)
        # (.*?): a computed part may be empty (f"{model} does not fit{here}: ...")
        m = re.fullmatch("(.*?)".join(map(re.escape, literal)), quote, re.S)
        if m and all(_value_ok(g, constants, nested) for g in m.groups()):
            return True
    return False


def check_message(text: str) -> str | None:
    """None if ``text`` (an ``error: ``/``hint: `` prefix allowed) is, whole, a message
    of the code with ``<placeholders>`` where it computes values; else what is wrong."""
    quote = text
    for prefix in ("error: ", "hint: "):
        quote = quote.removeprefix(prefix)
    return None if _match(quote) else f"no message in kit/ reads {quote!r}"


# --- env vars and paths ------------------------------------------------------------------

@lru_cache(maxsize=1)
def known_names_text() -> str:
    """The text env vars may be named in: kit/, the agent specs and templates, and the
    libraries whose variables the doc names (huggingface_hub's constants, platformdirs)."""
    import huggingface_hub.constants
    import platformdirs.unix

    files = [*(ROOT / "kit").rglob("*.py"), *(ROOT / "harnesses").glob("*.toml"),
             *(ROOT / "templates").rglob("*.j2"), Path(huggingface_hub.constants.__file__),
             Path(platformdirs.unix.__file__)]
    return "\n".join(f.read_text() for f in files)


def check_env(span: str) -> str | None:
    m = re.search(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b", span)
    if m and not re.search(rf"\b{m.group(1)}\b", known_names_text()):
        return f"{m.group(1)} is named nowhere in kit/, harnesses/, templates/ or the libraries"
    return None


_ROOTS_SCRIPT = r"""
import json, platformdirs.macos
from kit import paths
from kit.daemon import log_file
from kit.models.starter import hub_cache_dir
from kit.urls import parse_url
mac = platformdirs.macos.MacOS(paths.APP)
print(json.dumps([str(p) for p in (
    paths.state_dir(), paths.log_dir(), paths.data_dir(), paths.config_dir(),
    paths.kernel_cache_dir().parent, log_file(parse_url("http://127.0.0.1:8090")),
    hub_cache_dir(), mac.user_log_path, mac.user_state_path, mac.user_cache_path,
    mac.user_log_path / log_file(parse_url("http://127.0.0.1:8090")).name)]))
"""


@pytest.fixture(scope="module")
def path_roots(tmp_path_factory) -> tuple[str, list[str]]:
    """(HOME, the folders the code computes) in a throwaway HOME, without and with the
    XDG and HF variables set (to ``/<NAME>``, as the doc writes ``$NAME``)."""
    home = tmp_path_factory.mktemp("home")
    roots = []
    xdg = {v: f"/{v}" for v in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
                                 "XDG_CONFIG_HOME", "HF_HOME")}
    for extra in ({}, xdg):
        env = clean_env(home, **extra)
        for name in (*xdg, "HF_HUB_CACHE"):
            if name not in extra:
                env.pop(name, None)
        env["PYTHONPATH"] = str(ROOT)
        r = subprocess.run([sys.executable, "-c", _ROOTS_SCRIPT], env=env, capture_output=True,
                           text=True, timeout=60, check=True)
        roots += json.loads(r.stdout)
    return str(home), roots


def check_path(span: str, home: str, roots: list[str]) -> str | None:
    """None if ``span`` is a folder or file the code computes, or ``<placeholders>`` under
    one (``~`` is HOME, ``$NAME`` the variable set to ``/NAME``); else what is wrong."""
    path = re.sub(r"^~", home, span)
    path = re.sub(r"^\$([A-Z_]+)", r"/\1", path).rstrip("/")
    for root in roots:
        if path == root or path.startswith(root + "/"):
            rest = path[len(root):].strip("/")
            if all(_PLACEHOLDER.fullmatch(part) for part in rest.split("/") if part):
                return None
    return f"{span} is no folder or file the code computes (kit.paths, the hub cache)"


# --- the tests ---------------------------------------------------------------------------

def _failures(items, check) -> list[str]:
    return [f"docs/troubleshooting.md:{no}: {why}" for _kind, text, no in items
            if (why := check(text))]


@pytest.fixture(scope="module")
def items() -> list[tuple[str, str, int]]:
    return doc_items(DOC.read_text())


def _of(items, kind):
    return [i for i in items if i[0] == kind]


def test_every_command_line_names_real_commands_options_and_choices(items):
    assert len(_of(items, "command")) > 30
    assert not (bad := _failures(_of(items, "command"), check_command)), "\n".join(bad)


def test_every_flag_named_alone_is_an_option_of_some_command(items):
    assert _of(items, "flag")
    assert not (bad := _failures(_of(items, "flag"), check_flag)), "\n".join(bad)


def test_every_message_quoted_is_one_the_code_prints(items):
    assert len(_of(items, "message")) > 40
    assert not (bad := _failures(_of(items, "message"), check_message)), "\n".join(bad)


def test_every_environment_variable_is_one_the_code_or_its_libraries_read(items):
    assert len(_of(items, "env")) > 8
    assert not (bad := _failures(_of(items, "env"), check_env)), "\n".join(bad)


def test_every_path_is_under_a_folder_the_code_computes(items, path_roots):
    home, roots = path_roots
    assert _of(items, "path")
    bad = _failures(_of(items, "path"), lambda span: check_path(span, home, roots))
    assert not bad, "\n".join(bad)


def test_every_code_field_or_key_is_a_string_of_the_code(items):
    _templates, constants = source_strings()
    assert _of(items, "name")
    bad = _failures(_of(items, "name"), lambda name: None if name in constants
                    else f"{name!r} is no string literal of kit/")
    assert not bad, "\n".join(bad)


def test_the_states_status_tells_apart_are_the_engines_and_health_ok():
    """The states the doc lists for `mlx-kit status` are the engine's (kit/engine/proc/process.py
    sets them) and /health's ``ok``; none is missing from the doc."""
    text = DOC.read_text()
    para = text[text.index("`mlx-kit status` tells the states apart"):].split("\n\n")[0]
    named = set(re.findall(r"`([a-z]+)`", para))
    tree = ast.parse((ROOT / "kit" / "engine" / "proc" / "process.py").read_text())
    states = set()
    for node in ast.walk(tree):  # self.state = "x" / self.state, self.error = "x", ...
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Tuple)):
            target = node.targets[0]
            first_t = target.elts[0] if isinstance(target, ast.Tuple) else target
            first_v = node.value.elts[0] if isinstance(node.value, ast.Tuple) else node.value
            if isinstance(first_t, ast.Attribute) and first_t.attr == "state" \
                    and isinstance(first_v, ast.Constant):
                states.add(first_v.value)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "_restart_locked":
            states.add(node.args[0].value)
    assert states >= {"loading", "restarting", "failed", "stopped"}, states
    assert named == states | {"ok"}, f"the doc names {sorted(named)}, the code {sorted(states)}"


def test_the_doc_is_linked_from_the_readme_and_the_server_doc():
    assert "docs/troubleshooting.md" in (ROOT / "README.md").read_text()
    assert "troubleshooting.md" in (ROOT / "docs" / "server.md").read_text()


# --- the checks catch drift (each stale item is named) -----------------------------------

@pytest.mark.parametrize(("line", "stale"), [
    ("mlx-kit serve --prot 8091", "has no option --prot"),
    ("mlx-kit lunch pi", "has no command 'lunch'"),
    ("mlx-kit harness instal pi", "has no command 'instal'"),
    ("mlx-kit serve --log-level loud", "not 'loud'"),
])
def test_a_renamed_command_option_or_choice_is_named(line, stale):
    assert stale in (check_command(line) or "")


def test_a_changed_message_is_named():
    good = "cannot listen on <host>:<port>: Address already in use"
    assert check_message(good) is None
    assert "no message in kit/" in check_message(good.replace("listen", "bind"))
    # a computed part must be a placeholder in the doc, not text the code does not print
    assert check_message("cannot listen on <host>:<port>: the moon is full") is not None


def test_a_stale_environment_variable_or_path_is_named(path_roots):
    home, roots = path_roots
    assert "MLX_KIT_NO_SUCH_VAR" in check_env("MLX_KIT_NO_SUCH_VAR")
    assert check_path("~/.local/state/mlx-kit/log/server-8090.log", home, roots) is None
    assert check_path("~/.local/share/mlx-kit-logs/server.log", home, roots) is not None


def test_the_doc_parser_finds_each_kind():
    sample = ("### `error: cannot listen on <host>:<port>: Address already in use`\n"
              "Run `mlx-kit stop`, set `MLX_KIT_URL`, read `~/.cache/mlx-kit/ptx/<v>`, `--port`.\n"
              "```text\nhint: another server holds it; use --port\n```\n"
              "```bash\nmlx-kit logs -f   # follow\n```\n")
    kinds = [(k, t) for k, t, _no in doc_items(sample)]
    assert kinds == [("message", "error: cannot listen on <host>:<port>: Address already in use"),
                     ("command", "mlx-kit stop"), ("env", "MLX_KIT_URL"),
                     ("path", "~/.cache/mlx-kit/ptx/<v>"), ("flag", "--port"),
                     ("message", "hint: another server holds it; use --port"),
                     ("command", "mlx-kit logs -f")]
