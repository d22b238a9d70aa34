"""EngineConfig (kit/config.py) and its one table of knobs (kit/knobs.py): every knob has a
flag, a variable, a default and help; the config round-trips through `serve`'s own parser;
secrets never reach a command line; bad values name the flag or the variable."""

from __future__ import annotations

import pytest
import typer

from kit.cli import app
from kit.config import EngineConfig
from kit.errors import ConfigError
from kit.knobs import KNOBS, knobs_of


def _parsed(command: str, argv: list[str]) -> EngineConfig:
    """The config ``command`` builds from ``argv`` (its own typer parser, nothing run)."""
    import kit.cli.config_options as co

    seen: list[EngineConfig] = []
    cmd = typer.main.get_command(app).commands[command]
    original = cmd.callback
    try:
        import kit.config

        real = kit.config.EngineConfig.from_flags

        def capture(given):
            seen.append(real(given))
            raise typer.Exit(0)

        kit.config.EngineConfig.from_flags = capture  # type: ignore[method-assign]
        ctx = cmd.make_context(command, list(argv))
        with ctx:
            try:
                cmd.invoke(ctx)
            except typer.Exit:
                pass
    finally:
        kit.config.EngineConfig.from_flags = real  # type: ignore[method-assign]
        cmd.callback = original
    assert co  # the decorator module builds the options
    return seen[0]


def test_every_knob_has_a_flag_a_variable_a_default_and_help():
    schema = EngineConfig.model_json_schema(by_alias=False)["properties"]
    assert set(EngineConfig.model_fields) == {k.name for k in KNOBS}
    for k in KNOBS:
        assert k.flag.startswith("--") and k.env_var.startswith("MLX_KIT_"), k.name
        assert len(k.help) >= 9 and k.help.endswith((".", ")")), k.name
        assert k.commands, k.name
        field = EngineConfig.model_fields[k.name]
        assert field.default == k.default and field.description == k.help
        assert schema[k.name]["flag"] == k.flag and schema[k.name]["env"] == k.env_var
    envs = [k.env_var for k in KNOBS]
    flags = [k.flag for k in KNOBS]
    assert len(set(envs)) == len(envs) and len(set(flags)) == len(flags)


def test_no_flag_is_declared_twice_and_hidden_knobs_stay_out_of_help():
    from click.testing import CliRunner

    for command in ("serve", "launch", "fit"):
        cmd = typer.main.get_command(app).commands[command]
        names = [o for p in cmd.params for o in p.opts]
        assert len(names) == len(set(names)), command
        for k in knobs_of(command):
            assert k.flag in names, (command, k.flag)
    text = CliRunner().invoke(typer.main.get_command(app), ["serve", "--help"]).output
    assert "--idle-write-s" not in text and "--log-max-bytes" not in text
    assert "[env MLX_KIT_PROMPT_CACHE_DISK]" in " ".join(text.split())


def test_to_argv_round_trips_through_the_serve_parser(monkeypatch, tmp_path):
    for k in KNOBS:
        monkeypatch.delenv(k.env_var, raising=False)
    config = EngineConfig.from_flags({
        "model": "org/m", "port": 9001, "ttl": 30.0, "memory_budget": "8GiB",
        "swap_on_request": True, "alias": ("a-*=local", "b=org/m"), "kv_bits": 8,
        "kv_group_size": 32, "prompt_cache_disk": "1GiB", "docs": False,
        "hostfile": str(tmp_path / "hosts.json"), "warmup": "off", "log_level": "debug",
        "allow_origin": ("http://localhost:3000",), "idle_write_s": 1.0,
        "api_key": "sekret-123"})
    argv = config.to_argv()
    assert "sekret-123" not in " ".join(argv) and "--api-key" not in argv
    assert argv[argv.index("--memory-budget") + 1] == str(8 * 2**30)
    assert "--no-docs" in argv and "--idle-write-s" in argv
    again = _parsed("serve", argv)
    assert again == config.for_engine()  # equal but for the secret, which stays out
    assert again.secret("api_key") is None and config.secret("api_key") == "sekret-123"


def test_defaults_give_no_argv_and_launch_passes_only_its_knobs(monkeypatch):
    for k in KNOBS:
        monkeypatch.delenv(k.env_var, raising=False)
    assert EngineConfig.from_flags({}).to_argv() == []
    c = EngineConfig.from_flags({"kv_bits": 4, "port": 9000, "trust_remote_code": True})
    assert c.to_argv("launch") == ["--kv-bits", "4", "--trust-remote-code"]


def test_flags_win_over_variables_which_win_over_defaults(monkeypatch):
    monkeypatch.setenv("MLX_KIT_PORT", "9100")
    monkeypatch.setenv("MLX_KIT_HOSTS", "a.example, .b.example")
    monkeypatch.setenv("PORT", "1")  # a bare name is never read
    assert EngineConfig.from_flags({}).port == 9100
    assert EngineConfig.from_flags({"port": 9200}).port == 9200
    assert EngineConfig.from_flags({}).allow_host == ("a.example", ".b.example")
    # a list's flags add to its variable's items
    both = EngineConfig.from_flags({"allow_host": ("c.example", "a.example")}).allow_host
    assert both == ("a.example", ".b.example", "c.example")
    monkeypatch.delenv("MLX_KIT_PORT")
    assert EngineConfig.from_flags({}).port == 8090


@pytest.mark.parametrize(("given", "env", "message"), [
    ({"port": 0}, {}, "--port 0: Input should be greater than or equal to 1"),
    ({}, {"MLX_KIT_TTL": "soon"}, "MLX_KIT_TTL soon: Input should be a valid number"),
    ({"prompt_cache_disk": "lots"}, {}, "--prompt-cache-disk: not a size: 'lots'"),
    ({}, {"MLX_KIT_MEMORY_BUDGET": "8 apples"}, "MLX_KIT_MEMORY_BUDGET: not a size"),
    ({"kv_bits": 3}, {}, "--kv-bits 3 is not supported"),
    ({"kv_bits": 8, "max_batch": 4}, {}, "--kv-bits 8 cannot be combined with --max-batch 4"),
    ({}, {"MLX_KIT_API_KEY": ""}, None),  # an empty key is no key, not an error
])
def test_bad_values_name_the_flag_or_the_variable(monkeypatch, given, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if message is None:
        EngineConfig.from_flags(given)
        return
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_flags(given)
    assert e.value.message.startswith(message)


def test_a_secret_from_the_environment_is_never_shown(monkeypatch):
    monkeypatch.setenv("MLX_KIT_API_KEY", "sekret-456")
    c = EngineConfig.from_flags({})
    assert "sekret-456" not in repr(c) and "sekret-456" not in " ".join(c.to_argv())
    assert c.for_engine().api_key is None


def test_the_config_pickles_whole_for_the_engine_process():
    import pickle

    c = EngineConfig.from_flags({"kv_bits": 4, "prompt_cache_disk": "0"}).for_engine()
    again = pickle.loads(pickle.dumps(c))
    assert again == c and again.batch == 1 and again.prompt_cache_disk == 0


def test_every_mlx_kit_variable_is_declared_in_kit_knobs():
    """kit/knobs.py declares every MLX_KIT_* name kit uses (a knob's or a process's), and
    is the one module that reads them (env(), environment())."""
    import re
    from pathlib import Path

    from kit.knobs import VARIABLES

    root = Path(__file__).resolve().parents[1] / "kit"
    declared = set(VARIABLES) | {k.env_var for k in KNOBS}
    for path in root.rglob("*.py"):
        text = path.read_text()
        names = set(re.findall(r"\bMLX_KIT_[A-Z_]*[A-Z]\b", text))
        assert names <= declared, (path, names - declared)
        if path.name != "knobs.py":
            reads = re.findall(r"os\.(?:environ\.get|getenv)\((?:\"MLX_KIT|[A-Z_]*ENV\b)", text)
            assert not reads, (path, reads)


def test_a_knob_reaches_serve_from_its_flag_or_its_variable(monkeypatch):
    # the example knob of the closing note: one table entry, one use in serve
    for k in KNOBS:
        monkeypatch.delenv(k.env_var, raising=False)
    assert EngineConfig.from_flags({}).graceful_shutdown_s == 5
    assert _parsed("serve", ["--graceful-shutdown-s", "30"]).graceful_shutdown_s == 30
    monkeypatch.setenv("MLX_KIT_GRACEFUL_SHUTDOWN_S", "12")
    assert _parsed("serve", []).graceful_shutdown_s == 12
