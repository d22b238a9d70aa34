"""LoRA adapters the server mounts beside its model (``serve --adapter NAME=PATH``).

An adapter is a folder in mlx-lm's format, as ``mlx_lm.lora`` writes it:
``adapter_config.json`` (``fine_tune_type``, ``num_layers``, ``lora_parameters``) and
``adapters.safetensors`` (the low-rank weights). This module reads and checks those folders
without importing mlx (the CLI checks them before a server starts; the engine process
applies them, :mod:`kit.engine.decode.adapters`), and names what a request asks for:
``local:NAME`` runs on the model behind ``local`` with adapter ``NAME``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.errors import ConfigError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
#: what a request's ``model`` names an adapter by: ``local:NAME``
SEPARATOR = ":"
#: the most adapters one server mounts (each is a set of modules switched per request)
MAX_ADAPTERS = 32
_MAX_CONFIG_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class LoraParameters(BaseModel):
    """``lora_parameters`` of adapter_config.json: ``rank`` (r), ``scale`` (the low-rank
    update's multiplier), ``dropout`` (training only) and ``keys``, the module names it
    wraps in each block (None: mlx-lm's default for the model type)."""

    model_config = ConfigDict(extra="allow")
    rank: int = Field(ge=1, le=4096, strict=True)
    scale: float = Field(allow_inf_nan=False, strict=True)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    keys: list[str] | None = Field(None, max_length=256)


class AdapterConfig(BaseModel):
    """adapter_config.json as mlx-lm's trainer writes it (other keys it records, such as
    the training arguments, are kept and ignored). ``num_layers``: how many of the model's
    last blocks carry the adapter (-1: all). ``model``: what it was trained on, as given
    to the trainer (for messages only: a path or id may differ from ours and be the same
    weights)."""

    model_config = ConfigDict(extra="allow")
    fine_tune_type: Literal["lora", "dora"] = "lora"
    num_layers: int = Field(ge=-1, strict=True)
    lora_parameters: LoraParameters
    model: str | None = None


@dataclass(frozen=True)
class Adapter:
    """One mounted adapter: ``name`` (``local:NAME``), its ``path`` (absolute) and config."""

    name: str
    path: Path
    config: AdapterConfig

    @property
    def weights(self) -> Path:
        return self.path / WEIGHTS_FILE


def read_adapter(name: str, path: str | Path) -> Adapter:
    """Check the adapter folder ``path`` and read its config.

    Raises:
        ConfigError: naming the file: the folder or a file is missing, the config is not
            JSON, is over 1 MiB or is not mlx-lm's adapter format, or it is a full
            fine-tune (``fine_tune_type: full``: whole weights, a model of its own).
    """
    folder = Path(path).expanduser().absolute()
    flag = f"--adapter {name}={path}"
    if not folder.is_dir():
        raise ConfigError(f"{flag}: {folder} is not a folder",
                          hint=f"an adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE} "
                               "(what mlx_lm.lora --adapter-path writes)")
    config_file, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for file in (config_file, weights):
        if not file.is_file():
            raise ConfigError(f"{flag}: {file} is missing",
                              hint="is this the folder mlx_lm.lora wrote (--adapter-path)?")
    try:
        with config_file.open("rb") as f:
            raw = f.read(_MAX_CONFIG_BYTES + 1)
        if len(raw) > _MAX_CONFIG_BYTES:
            raise ValueError("over 1 MiB")
        data = json.loads(raw)
        if isinstance(data, dict) and data.get("fine_tune_type") == "full":
            raise ConfigError(
                f"{flag}: {config_file} is a full fine-tune (fine_tune_type: full), not an "
                "adapter", hint="serve its fused weights as a model: mlx-kit serve -m FOLDER")
        config = AdapterConfig.model_validate(data)
    except ConfigError:
        raise
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the whole file"
        raise ConfigError(f"{flag}: {config_file}: {where}: {err['msg']}",
                          hint="mlx-lm's adapter format: fine_tune_type lora or dora, "
                               "num_layers, lora_parameters {rank, scale}") from None
    except RecursionError:  # json's parser on brackets nested thousands deep
        raise ConfigError(f"{flag}: cannot read {config_file}: nested too deeply") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag}: cannot read {config_file}: {e}") from None
    return Adapter(name, folder, config)


def parse_adapters(items: tuple[str, ...] | list[str]) -> dict[str, Adapter]:
    """``--adapter`` flags (``NAME=PATH`` each) -> name -> :class:`Adapter`, in order.

    Raises:
        ConfigError: an item is not ``NAME=PATH``, a name is not 1-64 of letters,
            digits, ``.``, ``_``, ``-`` (starting with a letter or digit), a name repeats,
            more than :data:`MAX_ADAPTERS`, or a folder is refused (:func:`read_adapter`).
    """
    if len(items) > MAX_ADAPTERS:
        raise ConfigError(f"--adapter: {len(items)} adapters; at most {MAX_ADAPTERS}")
    adapters: dict[str, Adapter] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not path:
            raise ConfigError(f"--adapter {item}: expected NAME=PATH",
                              hint="e.g. --adapter sql=~/adapters/sql")
        if not _NAME.fullmatch(name):
            raise ConfigError(f"--adapter {item}: the name {name!r} must be 1-64 letters, "
                              "digits, '.', '_' or '-', starting with a letter or digit")
        if name in adapters:
            raise ConfigError(f"--adapter {item}: the name {name!r} is given twice")
        adapters[name] = read_adapter(name, path)
    return adapters


def adapter_of(requested: str, names: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """``("local", "NAME")`` when ``requested`` is ``local:NAME`` or ``<model>:NAME`` and
    NAME is one of ``names``; None otherwise (an ordinary model name)."""
    base, sep, name = requested.rpartition(SEPARATOR)
    if not sep or not base or name not in names:
        return None
    return base, name
