"""Model-name aliases: names that agents insist on (``claude-*``, ``gpt-*``, ``gemini-*``) served by
``local`` or by a real model. Patterns are shell-style (fnmatch), first match wins."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from kit import STABLE_MODEL_ID
from kit.errors import ConfigError

#: Served by ``local`` unless the user maps them elsewhere.
DEFAULT_ALIASES: tuple[tuple[str, str], ...] = (
    ("claude-*", STABLE_MODEL_ID),
    ("gpt-*", STABLE_MODEL_ID),
    ("o1*", STABLE_MODEL_ID),
    ("o3*", STABLE_MODEL_ID),
    ("o4*", STABLE_MODEL_ID),
    ("codex-*", STABLE_MODEL_ID),
    ("gemini-*", STABLE_MODEL_ID),
)


@dataclass(frozen=True)
class AliasTable:
    """Ordered (pattern, target) pairs; a target is ``local`` or a real model id."""

    rules: tuple[tuple[str, str], ...] = DEFAULT_ALIASES

    @classmethod
    def parse(cls, specs: list[str], defaults: bool = True) -> AliasTable:
        """Build from ``PATTERN=TARGET`` strings (ahead of the defaults).

        Raises:
            ConfigError: a spec without ``=``.
        """
        rules = []
        for spec in specs:
            pattern, sep, target = spec.partition("=")
            if not sep or not pattern.strip() or not target.strip():
                raise ConfigError(f"bad alias {spec!r}", hint="use PATTERN=TARGET, e.g. "
                                  "'claude-*=local'")
            rules.append((pattern.strip(), target.strip()))
        return cls(tuple(rules) + (DEFAULT_ALIASES if defaults else ()))

    def target(self, name: str) -> str | None:
        """The target of the first rule matching ``name``, or None."""
        for pattern, target in self.rules:
            if fnmatchcase(name, pattern):
                return target
        return None
