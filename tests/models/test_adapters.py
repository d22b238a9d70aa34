"""``serve --adapter NAME=PATH``'s checks before any model loads (kit/models/adapters.py):
what a user mistypes or points at the wrong folder is refused naming the flag and the file.
Model-free; the adapters' weights on a real model are tested in
tests/server/test_adapters_model.py."""

from __future__ import annotations

import json

import pytest

from kit.config import EngineConfig
from kit.errors import ConfigError
from kit.models.adapters import MAX_ADAPTERS, adapter_of, parse_adapters


def adapter_folder(path, **config):
    """A folder in mlx_lm.lora's layout (the weights file is only checked to exist here)."""
    path.mkdir(parents=True, exist_ok=True)
    body = {"fine_tune_type": "lora", "num_layers": 2, "model": "starter",
            "lora_parameters": {"rank": 4, "scale": 20.0, "dropout": 0.0}, **config}
    (path / "adapter_config.json").write_text(json.dumps(body))
    (path / "adapters.safetensors").write_bytes(b"")
    return path


def test_name_equals_path_gives_each_adapter_its_absolute_folder_and_config(tmp_path):
    a, b = adapter_folder(tmp_path / "a"), adapter_folder(tmp_path / "b", fine_tune_type="dora")
    got = parse_adapters([f"sql={a}", f"pirate.v2={b}"])
    assert list(got) == ["sql", "pirate.v2"]
    assert got["sql"].path == a and got["sql"].config.lora_parameters.rank == 4
    assert got["pirate.v2"].config.fine_tune_type == "dora"


@pytest.mark.parametrize("item, words", [
    ("sql", "expected NAME=PATH"),
    ("sql=", "expected NAME=PATH"),
    ("=x", "must be 1-64"),
    ("bad name=x", "must be 1-64"),
    ("-x=x", "must be 1-64"),
])
def test_a_flag_that_is_not_name_equals_path_is_refused_naming_it(item, words):
    with pytest.raises(ConfigError, match=words) as e:
        parse_adapters([item])
    assert f"--adapter {item}" in str(e.value)


def test_a_missing_folder_or_file_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        parse_adapters([f"a={tmp_path / 'nope'}"])
    folder = adapter_folder(tmp_path / "a")
    (folder / "adapters.safetensors").unlink()
    with pytest.raises(ConfigError) as e:
        parse_adapters([f"a={folder}"])
    assert str(folder / "adapters.safetensors") in str(e.value) and "missing" in str(e.value)


def test_a_config_that_is_not_mlx_lms_format_is_refused_naming_the_field(tmp_path):
    folder = adapter_folder(tmp_path / "a", lora_parameters={"scale": 1.0})
    with pytest.raises(ConfigError, match=r"adapter_config.json: lora_parameters.rank"):
        parse_adapters([f"a={folder}"])
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read .*adapter_config.json"):
        parse_adapters([f"a={folder}"])
    (folder / "adapter_config.json").write_text(" " * (1 << 20) + "{}")
    with pytest.raises(ConfigError, match="over 1 MiB"):
        parse_adapters([f"a={folder}"])


def test_a_config_nested_deep_or_not_an_object_or_with_a_nan_scale_is_refused(tmp_path):
    """Regression: brackets nested thousands deep raised RecursionError (a traceback)."""
    folder = adapter_folder(tmp_path / "a")
    config = folder / "adapter_config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_adapters([f"a={folder}"])
    config.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="adapter_config.json: the whole file"):
        parse_adapters([f"a={folder}"])
    config.write_text('{"num_layers": 2, "lora_parameters": {"rank": 8, "scale": NaN}}')
    with pytest.raises(ConfigError, match="lora_parameters.scale"):
        parse_adapters([f"a={folder}"])


@pytest.mark.parametrize("field, value", [("num_layers", "4"), ("num_layers", True),
                                          ("rank", "8"), ("scale", "20")])
def test_numbers_written_as_strings_or_booleans_are_refused_naming_the_field(
        tmp_path, field, value):
    folder = adapter_folder(tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    (config if field == "num_layers" else config["lora_parameters"])[field] = value
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=field):
        parse_adapters([f"a={folder}"])


def test_a_full_fine_tune_is_refused_as_a_model_of_its_own(tmp_path):
    folder = adapter_folder(tmp_path / "a", fine_tune_type="full")
    with pytest.raises(ConfigError, match="full fine-tune") as e:
        parse_adapters([f"a={folder}"])
    assert "serve -m" in e.value.hint


def test_a_name_given_twice_and_too_many_adapters_are_refused(tmp_path):
    folder = adapter_folder(tmp_path / "a")
    with pytest.raises(ConfigError, match="given twice"):
        parse_adapters([f"a={folder}", f"a={folder}"])
    with pytest.raises(ConfigError, match=f"at most {MAX_ADAPTERS}"):
        parse_adapters([f"a{i}={folder}" for i in range(MAX_ADAPTERS + 1)])


def test_a_request_names_an_adapter_as_local_colon_name():
    assert adapter_of("local:sql", ["sql"]) == ("local", "sql")
    assert adapter_of("org/model:sql", ["sql"]) == ("org/model", "sql")
    assert adapter_of("local:other", ["sql"]) is None
    assert adapter_of("local", ["sql"]) is None and adapter_of(":sql", ["sql"]) is None


def test_adapters_are_refused_with_a_distributed_world(tmp_path):
    folder = adapter_folder(tmp_path / "a")
    with pytest.raises(ConfigError, match="--adapter runs on one machine"):
        EngineConfig(adapter=(f"a={folder}",), ranks=2)
