"""The JSON schema of agent specs, as published in docs/agents/harness-spec.schema.json.

Regenerate the published file after changing :class:`kit.harness.spec.HarnessSpec`::

    python -m kit.harness.schema > docs/agents/harness-spec.schema.json

Editors that read JSON schemas for TOML (taplo / Even Better TOML, tombi) pick it up from
the ``#:schema`` line at the top of each spec file (docs/agents/adding-an-agent.md).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from kit.harness.spec import HarnessSpec

SCHEMA_FILE = "docs/agents/harness-spec.schema.json"
REGENERATE = f"python -m kit.harness.schema > {SCHEMA_FILE}"


class _TomlSchema(GenerateJsonSchema):
    """TOML has no null: an optional key is one you leave out, so ``X | None`` is
    published as ``X`` (and its ``default: null`` dropped, in :func:`schema`)."""

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def _drop_null_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_null_defaults(v) for k, v in node.items()
                if not (k == "default" and v is None)}
    if isinstance(node, list):
        return [_drop_null_defaults(v) for v in node]
    return node


def schema() -> dict:
    """``HarnessSpec.model_json_schema()`` for TOML files, with a title. No ``$schema``
    key: taplo validates with the draft it supports, and nothing here needs more than
    draft 4 has (``$defs`` is only a place that ``$ref`` pointers point into)."""

    out = _drop_null_defaults(HarnessSpec.model_json_schema(schema_generator=_TomlSchema))
    out["title"] = "mlx-kit agent spec (harnesses/<agent>.toml)"
    return out


def schema_text() -> str:
    """The published file's exact text: 2-space JSON, keys in the model's order, a newline
    at the end."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
