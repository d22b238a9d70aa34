"""One line of ``mlx-kit doctor``'s report: :class:`Check`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]
#: statuses from best to worst (a line made of parts takes its worst)
ORDER: tuple[Status, ...] = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One checked thing.

    Attributes:
        area: the group it is printed under (``system``, ``server``, ``network``,
            ``cache``, ``agents``).
        name: what was checked (``python``, ``mlx``, ``port``, ``agent pi`` ...).
        status: ``ok``, ``warn`` (launch works, but something is off) or ``fail``
            (launch fails, or a failure is certain to follow).
        detail: what was found, one line.
        fix: one line to run or do, when ``status`` is not ``ok``; else None.
        data: the facts behind the line, for ``--json`` (versions, paths, URLs).
    """

    area: str
    name: str
    status: Status
    detail: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The check as ``doctor --json`` prints it."""
        return {"area": self.area, "name": self.name, "status": self.status,
                "detail": self.detail, "fix": self.fix, "data": self.data}


def worst(statuses: list[Status]) -> Status:
    """The worst of ``statuses`` (``ok`` for none)."""
    return max(statuses, key=ORDER.index, default="ok")
