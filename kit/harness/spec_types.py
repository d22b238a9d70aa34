"""The field types of agent specs (kit/harness/spec.py): bounded strings, relative paths,
folders, environment names, launch values, [vars] values, each with the rule it checks.

A rule's ValueError becomes the one-line message of :mod:`kit.harness.spec_errors`, with
the dotted key pydantic reports it at.
"""

from __future__ import annotations

import math
import re
import string
from pathlib import PurePosixPath
from typing import Annotated, Any, Union

from pydantic import AfterValidator, Field, PlainValidator, StrictStr

from kit.errors import HarnessError
from kit.harness.merge import list_selector

_ENV_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[^/]+)*")


def _relative(value: str) -> str:
    parts = PurePosixPath(value).parts
    if not parts or value.startswith(("/", "~")) or "\\" in value or ".." in parts:
        raise ValueError(f"must be a relative path inside its folder, not {value!r}")
    return value


def placeholders(value: str) -> list[str]:
    """The ``{name}`` fields of a ``str.format`` text; a conversion or format spec is
    refused (values are paths and words, never formatted numbers)."""
    try:
        fields = [f for f in string.Formatter().parse(value) if f[1] is not None]
    except ValueError as e:
        raise ValueError(f"bad placeholder in {value!r}: {e}") from None
    if any(spec or conv for _, _, spec, conv in fields):
        raise ValueError(f"{value!r}: a placeholder is a plain {{name}}")
    return [name for _, name, _, _ in fields]


def _folder(value: str) -> str:
    names = set(placeholders(value))
    if names - {"kit_config_dir"} or not value.startswith(("~", "/", "{kit_config_dir}")):
        raise ValueError(f"{value!r} must start with ~, / or {{kit_config_dir}} (mlx-kit's "
                         "own config folder), the only placeholder a folder may name")
    return value


def _env_list(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 16 or not all(
            isinstance(v, str) and _ENV_ENTRY.fullmatch(v) and ".." not in v.split("/")
            for v in items):
        raise ValueError('env must be a variable name or a list of "VAR" / "VAR/sub/dir"')
    return tuple(items)


def _scalar(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if isinstance(value, str) and len(value) > 1000:
        raise ValueError("too long (at most 1000 characters)")
    if not isinstance(value, (str, bool, int, float)):
        raise ValueError(f"must be a string, integer, number or boolean, not a "
                         f"{type(value).__name__}")
    return value


def _selector(value: str) -> str:
    try:
        list_selector(value)
    except HarnessError as e:
        raise ValueError(e.message) from None
    return value


Text = Annotated[StrictStr, Field(min_length=1, max_length=1000)]
RelPath = Annotated[StrictStr, Field(min_length=1, max_length=300), AfterValidator(_relative)]
Folder = Annotated[StrictStr, Field(min_length=1, max_length=300), AfterValidator(_folder)]
EnvName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)]
EnvEntry = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(/[^/]+)*$",
                                      max_length=300)]
EnvList = Annotated[tuple[str, ...], PlainValidator(
    _env_list, json_schema_input_type=Union[EnvEntry, list[EnvEntry]])]
LaunchValue = Annotated[StrictStr, Field(max_length=1000)]
Version = Annotated[StrictStr, Field(pattern=r"^\d+(\.\d+)*$", max_length=40)]
VarName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=64)]
VarValue = Annotated[Any, PlainValidator(_scalar,
                                         json_schema_input_type=Union[str, int, float, bool])]
Owned = Annotated[StrictStr, Field(min_length=1, max_length=300), AfterValidator(_selector)]
