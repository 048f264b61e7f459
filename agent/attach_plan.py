"""What each loaded probe group expected to attach on this kernel against what BCC attached:
`doctor --load` prints it, `record` keeps it in meta.json and says what did not attach."""
from __future__ import annotations

from dataclasses import dataclass

from .probes import ProbeGroup


@dataclass(frozen=True)
class Attached:
    """A loaded group's plan on this kernel against what BCC attached."""
    expected: dict[str, str]     # attach point -> what a recording loses without it
    attached: frozenset[str]     # every point the program attached to, of any group

    def missing(self) -> list[str]:
        return [point for point in self.expected if point not in self.attached]

    def summary(self) -> str:
        return f"attached {len(self.expected) - len(self.missing())} of {len(self.expected)} expected points"

    def details(self) -> list[str]:
        return [f"not attached: {point} (lost: {self.expected[point]})" for point in self.missing()]

    def as_json(self) -> dict:
        return {"expected": len(self.expected), "attached": len(self.expected) - len(self.missing()),
                "missing": {point: self.expected[point] for point in self.missing()}}


def compare(groups: list[ProbeGroup], attached: set[str]) -> tuple[dict[str, Attached], list[str]]:
    """Each group's expected attach points, loaded together, against `attached`. -> (by group
    name, the points attached that no group expected)."""
    together = {g.name for g in groups}
    plans = {g.name: Attached(g.attach_points(together), frozenset(attached)) for g in groups}
    planned = {point for plan in plans.values() for point in plan.expected}
    return plans, sorted(attached - planned)
