"""Agent specs as validated data: the published JSON schema is the model's and accepts what
mlx-kit accepts, every refusal names the file and the key, [vars] reach only their own
agent's templates, {kit_config_dir} is mlx-kit's platformdirs folder, and the user's own
agents load through the same loader as the built-ins without ever replacing one."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

import jsonschema_rs
import pytest

from kit import __version__
from kit.errors import HarnessError
from kit.harness import formats
from kit.harness.render import context, render
from kit.harness.schema import REGENERATE, SCHEMA_FILE, schema_text
from kit.harness.spec import APIS, FileSpec, HarnessSpec, parse_spec
from kit.harness.spec_loader import all_specs, load_all, load_spec
from kit.paths import harnesses_dir
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHIPPED = sorted(harnesses_dir().glob("*.toml"))


def shipped(agent: str) -> dict:
    return tomllib.loads((harnesses_dir() / f"{agent}.toml").read_text())


# --- the published schema -----------------------------------------------------------------

def test_the_published_schema_is_the_models():
    published = (REPO / SCHEMA_FILE).read_text(encoding="utf-8")
    assert published == schema_text(), f"{SCHEMA_FILE} is stale: run `{REGENERATE}`"


@pytest.mark.parametrize("draft", [jsonschema_rs.Draft4Validator,
                                   jsonschema_rs.Draft202012Validator], ids=["draft4", "2020-12"])
def test_the_schema_accepts_the_shipped_specs_and_refuses_typos(draft):
    """Draft 4 is what taplo (the TOML language server behind most editors) validates
    with: the schema must work there too."""
    validator = draft(json.loads((REPO / SCHEMA_FILE).read_text()))
    for path in SHIPPED:
        assert validator.is_valid(tomllib.loads(path.read_text())), path.name
    for edit in (lambda d: d.update(colour="blue"),
                 lambda d: d["files"][0].update(mode="symlink"),
                 lambda d: d.update(api="openai"),
                 lambda d: d["launch"].update(env={"X": 1}),
                 lambda d: d.update(vars={"x": [1]})):
        data = shipped("pi")
        edit(data)
        assert not validator.is_valid(data)
        with pytest.raises(HarnessError):
            parse_spec(data, "pi.toml")  # the loader refuses what the schema refuses


def test_every_shipped_spec_points_editors_at_the_schema():
    for path in SHIPPED:
        first = path.read_text().splitlines()[0]
        assert first == "#:schema ../docs/agents/harness-spec.schema.json", path.name
        assert (path.parent / first.split()[1]).resolve() == (REPO / SCHEMA_FILE).resolve()


def test_the_spec_enumerations_are_the_machinerys():
    assert typing.get_args(FileSpec.model_fields["format"].annotation)[0].__args__ == \
        formats.FORMATS
    assert set(typing.get_args(HarnessSpec.model_fields["api"].annotation)) == set(APIS)


def test_each_api_is_a_route_the_server_serves():
    from kit.server import anthropic, gemini, openai_chat, openai_responses

    modules = (anthropic, gemini, openai_chat, openai_responses)
    paths = {getattr(route, "path", "") for module in modules for route in module.router.routes}
    for api, route in APIS.items():
        assert any(p.startswith(route) for p in paths), (api, route, sorted(paths))
    used = {s.api for s in all_specs().values()}
    assert used == set(APIS)  # every value is one a shipped agent speaks


# --- refusals name the file and the key ---------------------------------------------------

@pytest.mark.parametrize("edit, message, hint", [
    (lambda d: d.update(api="openai"),
     "pi.toml: api: must be 'openai-completions', 'openai-responses', 'anthropic-messages' or "
     "'gemini' (got 'openai')", "The wire API"),
    (lambda d: d["vars"].update(discovery_timeout_ms=[1]),
     "pi.toml: vars.discovery_timeout_ms: must be a string, integer, number or boolean, not "
     "a list", "This agent's own template variables"),
    (lambda d: d["vars"].update({"bad name": 1}),
     'pi.toml: vars."bad name": does not match', "This agent's own template variables"),
    (lambda d: d["vars"].update(x=float("inf")), "pi.toml: vars.x: must be a finite number",
     None),
    (lambda d: d["files"][0].update(path="../../.bashrc"),
     "pi.toml: files[0].path: must be a relative path inside its folder", "Where the file"),
    (lambda d: d["files"][0].update(format="json"),
     'pi.toml: files[0]: format, strategy, key, owns and stamped are for mode = "merge"', None),
    (lambda d: d["config_dir"].update(default="{home}/.pi"),
     "pi.toml: config_dir.default: '{home}/.pi' must start with ~, / or {kit_config_dir}",
     "The folder when no env variable is set"),
    (lambda d: d["launch"].update(env={"A B": "x"}),
     'pi.toml: launch.env."A B": does not match', "Extra environment"),
    (lambda d: d["launch"].update(args=["{file0!r}"]),
     "pi.toml: launch.args[0]: '{file0!r}': a placeholder is a plain {name}", None),
    (lambda d: d.update(verified=["1.0"]), "pi.toml: verified: needs at least 2 items",
     "The oldest and newest agent version"),
    (lambda d: d["files"].append({"path": "x", "template": "pi/mlx-kit.ts.j2",
                                  "mode": "merge", "format": "json", "strategy": "keys"}),
     "pi.toml: files[1]: strategy keys needs owns", None),
], ids=["api", "var-type", "var-name", "var-inf", "path-escapes", "drop-in-with-format",
        "folder-placeholder", "env-name", "placeholder-conversion", "verified-one",
        "keys-without-owns"])
def test_a_malformed_spec_names_the_file_and_the_key(edit, message, hint):
    data = shipped("pi")
    edit(data)
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, "pi.toml")
    assert exc.value.message.startswith(message), exc.value.message
    assert "\n" not in exc.value.message
    if hint is not None:
        assert exc.value.hint.startswith(hint)


def test_an_unknown_key_hint_lists_the_keys_that_table_takes():
    data = shipped("pi")
    data["launch"]["argz"] = []
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, "pi.toml")
    assert exc.value.message == "pi.toml: launch.argz: unknown key"
    assert exc.value.hint == "known keys here: args, env, env_defaults"


def test_a_user_spec_file_too_large_is_refused_unread(home):
    folder = home / ".config" / "mlx-kit" / "harnesses"
    folder.mkdir(parents=True)
    (folder / "big.toml").write_text("# x\n" * 70_000)
    problems = load_all().problems
    assert [p.message for p in problems.values()] == [
        f"{folder / 'big.toml'}: larger than 256 KiB"]


# --- [vars] ---------------------------------------------------------------------------------

MODELS = [{"id": "local", "name": "SmolLM2 135M", "model": "mlx-kit/SmolLM2-135M-Instruct",
           "context_window": 8192, "max_tokens": 2048,
           "capabilities": {"tools": True, "reasoning": True, "vision": False}},
          {"id": "mlx-kit/SmolLM2-135M-Instruct", "name": "SmolLM2 135M",
           "model": "mlx-kit/SmolLM2-135M-Instruct", "context_window": 8192,
           "max_tokens": 2048, "capabilities": {"tools": True, "reasoning": True,
                                                "vision": False}}]


def test_pi_extension_is_byte_identical_now_that_its_knobs_are_vars(home):
    """The two values that sat in every template's context are in pi.toml's [vars]; the
    extension is the same file, byte for byte, as before (tests/data/harness/)."""
    golden = (REPO / "tests" / "data" / "harness" / "pi-mlx-kit.ts").read_text(
        encoding="utf-8").replace("<kit_version>", __version__)
    spec = load_spec("pi")
    assert spec.vars == {"discovery_timeout_ms": 1500, "max_reserve_fraction": 0.25}
    [text] = render(spec, context("http://127.0.0.1:8090/v1", MODELS,
                                  "probe of http://127.0.0.1:8090/v1/models")).values()
    assert text == golden


def test_vars_are_not_in_the_shared_context():
    ctx = context("http://127.0.0.1:1/v1", MODELS, "t")
    assert "discovery_timeout_ms" not in ctx and "max_reserve_fraction" not in ctx


def _user_agent(home: Path, spec_text: str, templates: dict[str, str]) -> None:
    root = home / ".config" / "mlx-kit"
    (root / "harnesses").mkdir(parents=True)
    (root / "harnesses" / "toy.toml").write_text(spec_text)
    for name, text in templates.items():
        (root / "templates" / "toy").mkdir(parents=True, exist_ok=True)
        (root / "templates" / "toy" / name).write_text(text)


TOY = '''name = "toy"
binary = "toy"
install = "true"
api = "openai-responses"
[config_dir]
default = "~/.toy"
[vars]
greeting = "hi \\"there\\""
[[files]]
path = "toy.json"
template = "toy/toy.json.j2"
'''


def test_an_agent_sees_its_own_vars_only(home):
    _user_agent(home, TOY, {"toy.json.j2": '{"g": {{ vars.greeting | js }}}\n'})
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t")).values()
    assert json.loads(text) == {"g": 'hi "there"'}

    _other = TOY.replace('name = "toy"', 'name = "toy2"').replace(
        "[vars]\ngreeting", "[vars]\nother")
    (home / ".config/mlx-kit/harnesses/toy2.toml").write_text(_other)
    with pytest.raises(HarnessError) as exc:  # toy2's template is toy's: no greeting there
        render(load_spec("toy2"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert exc.value.message.endswith("toy.json.j2: vars has no attribute 'greeting'")
    assert exc.value.hint == "toy2's [vars]: other"


def test_a_broken_user_template_is_a_clean_error_naming_it(home):
    _user_agent(home, TOY, {"toy.json.j2": '{"g": {{ vars.greeting | js }\n'})
    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert exc.value.message.startswith(
        f"{home / '.config/mlx-kit/templates/toy/toy.json.j2'}:1: ")


# --- {kit_config_dir} and the user's config folder -----------------------------------------

def test_aiders_folder_is_in_mlx_kits_config_dir(home, tmp_path, monkeypatch):
    spec = load_spec("aider")
    assert spec.config_dir_default == "{kit_config_dir}/aider"
    assert spec.config_dir() == home / ".config" / "mlx-kit" / "aider"  # as before, on Linux
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert spec.config_dir() == tmp_path / "xdg" / "mlx-kit" / "aider"


def test_user_agents_load_after_the_builtins_through_the_same_loader(home):
    _user_agent(home, TOY, {"toy.json.j2": "{}\n"})
    agents = load_all()
    names = list(agents.specs)
    assert names[-1] == "toy" and sorted(names[:-1]) == names[:-1]
    assert all(s.builtin for n, s in agents.specs.items() if n != "toy")
    toy = agents.specs["toy"]
    assert (toy.builtin, toy.templates) == (False, home / ".config/mlx-kit/templates")


def test_a_user_spec_cannot_use_a_builtins_template(home):
    _user_agent(home, TOY.replace("toy/toy.json.j2", "pi/mlx-kit.ts.j2"), {})
    with pytest.raises(HarnessError) as exc:
        load_spec("toy")
    assert exc.value.message.endswith("toy.toml: files[0].template: template "
                                      "'pi/mlx-kit.ts.j2' not found")
    assert exc.value.hint == f"looked in {home / '.config/mlx-kit/templates'}"


def test_an_unknown_agent_hint_counts_refused_user_specs(home):
    _user_agent(home, "name = 1\n", {})
    with pytest.raises(HarnessError) as exc:
        load_spec("nope")
    assert exc.value.hint.startswith("known agents: aider, claude")
    assert exc.value.hint.endswith("1 spec file(s) refused: see `mlx-kit harness list`")


def test_a_misspelt_key_is_named_before_the_missing_one_it_leaves():
    data = shipped("pi")
    data["files"][0]["templte"] = data["files"][0].pop("template")
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, "pi.toml")
    assert exc.value.message == "pi.toml: files[0].templte: unknown key (+1 more)"


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, "{a=" * 3000 + "1" + "}" * 3000],
                         ids=["arrays", "inline-tables"])
def test_a_deeply_nested_user_spec_is_a_problem_not_a_crash(home, nested):
    """tomllib recurses per nesting level: a small file nested thousands deep raised a
    RecursionError that crashed `harness list` for every agent."""
    folder = home / ".config" / "mlx-kit" / "harnesses"
    folder.mkdir(parents=True)
    (folder / "deep.toml").write_text(f"x = {nested}\n")
    agents = load_all()
    assert [p.message for p in agents.problems.values()] == [
        f"{folder / 'deep.toml'}: nested too deeply to be an agent spec"]
    assert "pi" in agents.specs


# --- a user's template is data: sandboxed and bounded ---------------------------------------

@pytest.mark.parametrize("body, message", [
    ("{{ cycler.__init__.__globals__.os.popen('touch pwned').read() }}",
     "access to attribute '__init__' of 'type' object is unsafe."),
    ("{{ ''.__class__.__mro__ }}", "access to attribute '__class__' of 'str' object is unsafe."),
    ("{{ models.append(1) }}", "access to attribute 'append' of 'list' object is unsafe."),
    ("{{ 'x' * 10**12 }}", "a str of 1 times 1000000000000 is too large"),
    ("{{ 10 ** (10 ** 10) }}", "10 ** 10000000000 is too large"),
    ("{% for i in range(99999) %}{{ 'x' * 99 }}{% endfor %}",
     "renders more than 1048576 characters"),
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
     "RecursionError: maximum recursion depth exceeded"),
    ("{% include '../../../secret.txt' %}", "includes '../../../secret.txt', not a template in"),
], ids=["run-a-command", "mro", "mutate", "huge-string", "huge-power", "huge-output",
        "divide-by-zero", "endless-recursion", "include-outside"])
def test_a_user_template_cannot_run_code_or_exhaust_memory(home, body, message, monkeypatch):
    """The Environment was not sandboxed: `harness show` / `install --dry-run` of a spec
    copied from anywhere ran the command in its template."""
    monkeypatch.chdir(home)
    (home / "secret.txt").write_text("secret")
    _user_agent(home, TOY, {"toy.json.j2": "{{ marker }}\n" + body + "\n"})
    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    where = home / ".config/mlx-kit/templates/toy/toy.json.j2"
    assert exc.value.message.startswith(f"{where}: {message}")
    assert not (home / "pwned").exists()


@pytest.mark.parametrize("body, message", [
    # each built its whole text (or one huge value) before any bound was checked
    ("{% for i in range(99999) %}{{ 'x' * 999999 }}{% endfor %}",
     "renders more than 1048576 characters"),
    ("{{ 'x'.ljust(4 * 10**9) }}", "rendering needs more than 512 MiB of memory"),
    ("{% set s %}{% for i in range(99999) %}{{ 'x' * 999999 }}{% endfor %}{% endset %}",
     "rendering needs more than 512 MiB of memory"),
    # no output, no call, no attribute: only a clock stops it
    ("{% set s = 'x' * 999999 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
     "rendering took longer than 10 s; stopped"),
], ids=["output-grows-past-the-bound", "one-huge-value", "buffered-block", "endless-loop"])
def test_a_user_template_is_bounded_while_it_renders_in_memory_and_time(home, body, message):
    """Issue 25: the rendered text was measured after rendering (a loop of 1 MiB values
    grew to ~100 GB first), and nothing bounded one expression's memory or the time."""
    import time

    _user_agent(home, TOY, {"toy.json.j2": "{{ marker }}\n" + body + "\n"})
    t0 = time.monotonic()
    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert message in exc.value.message
    assert time.monotonic() - t0 < 60


def test_the_render_child_imports_no_kit_folder_of_the_working_directory(home, monkeypatch):
    # `python -m` puts the working directory first on sys.path: a `kit/` there (a cloned
    # repository's) would have run as the render child
    (home / "kit").mkdir()
    (home / "kit" / "__init__.py").write_text(
        "import pathlib; pathlib.Path(__file__).with_name('pwned').touch()\n")
    monkeypatch.chdir(home)
    _user_agent(home, TOY, {"toy.json.j2": "{{ marker }}\n"})
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t")).values()
    assert text == "mlx-kit:generated (do not edit)\n"
    assert not (home / "kit" / "pwned").exists()


def test_a_user_template_linking_out_of_its_folder_is_refused_unread(home):
    """Issue 25: jinja2's FileSystemLoader followed a link anywhere: a template that is a
    link to ~/.ssh/id_ed25519 (a repository cloned into the config folder can hold one)
    rendered the key into the agent's config file."""
    import os

    _user_agent(home, TOY, {"other.j2": "{{ marker }}\n"})
    secret = home / ".ssh" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY\n")
    os.symlink(secret, home / ".config/mlx-kit/templates/toy/toy.json.j2")
    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert f"links to {secret}, outside {home / '.config/mlx-kit/templates'}" \
        in exc.value.message
    assert "PRIVATE KEY" not in exc.value.message + exc.value.hint
    # ... and through an include
    (home / ".config/mlx-kit/templates/toy/toy.json.j2").unlink()
    (home / ".config/mlx-kit/templates/toy/toy.json.j2").write_text(
        "{% include 'toy/key.j2' %}")
    os.symlink(secret, home / ".config/mlx-kit/templates/toy/key.j2")
    with pytest.raises(HarnessError) as exc:
        render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t"))
    assert "template 'toy/key.j2': links to" in exc.value.message


def test_a_user_template_folder_that_is_itself_a_link_still_renders(home):
    # GNU stow's default: ~/.config/mlx-kit/templates -> ~/dotfiles/...: the user's choice
    import os

    _user_agent(home, TOY, {"toy.json.j2": "{{ marker }}\n"})
    root = home / ".config/mlx-kit"
    (root / "templates").rename(home / "dotfiles")
    os.symlink(home / "dotfiles", root / "templates")
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t")).values()
    assert text == "mlx-kit:generated (do not edit)\n"


@pytest.mark.parametrize("kind", ["fifo", "link-out"])
def test_a_user_spec_that_is_a_fifo_or_links_out_is_a_problem_not_a_hang(home, kind):
    """Issue 25: a spec file that was a FIFO blocked `harness list` forever (open waits
    for a writer); one linking out of the folder was read wherever it pointed."""
    import os

    folder = home / ".config" / "mlx-kit" / "harnesses"
    folder.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(folder / "toy.toml")
        expected = "not a regular file"
    else:  # a file of the user's is followed (stow), unless others may change it
        (home / "elsewhere.toml").write_text(TOY)
        (home / "elsewhere.toml").chmod(0o646)
        os.symlink(home / "elsewhere.toml", folder / "toy.toml")
        expected = f"links to {home / 'elsewhere.toml'}, outside {folder}, which others " \
                   "may change (mode 0646)"
    agents = load_all()
    assert [p.message for p in agents.problems.values()] == [
        f"{folder / 'toy.toml'}: {expected}"]
    assert "pi" in agents.specs and "toy" not in agents.specs


def test_the_sandbox_still_renders_what_templates_do(home):
    _user_agent(home, TOY, {"toy.json.j2": "{{ marker }} {{ 'ab' * 2 }} {{ 2 ** 10 }} "
                            "{{ models | map(attribute='id') | join(',') }}"})
    [text] = render(load_spec("toy"), context("http://127.0.0.1:1/v1", MODELS, "t")).values()
    assert text == "mlx-kit:generated (do not edit) abab 1024 local,mlx-kit/SmolLM2-135M-Instruct"
