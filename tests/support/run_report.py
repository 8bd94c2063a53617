"""What the test modules record for the end-of-run summary (printed by conftest.py).

Each pytest process (each xdist worker) fills its own ``REPORT``; conftest.py
sends a worker's report to the controller (``to_dict``) and merges them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter


@dataclasses.dataclass
class Report:
    examples: Counter = dataclasses.field(default_factory=Counter)  # property -> examples run
    seconds: Counter = dataclasses.field(default_factory=Counter)  # property -> seconds in its bodies
    traded: Counter = dataclasses.field(
        default_factory=Counter
    )  # property -> plans that traded bytes for launches
    reference_checked: list[str] = dataclasses.field(default_factory=list)  # property examples
    oracle_artifacts: list[str] = dataclasses.field(default_factory=list)  # differential cases

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Counter) else list(v)
        return out

    def merge(self, data: dict) -> None:
        for k, v in data.items():
            mine = getattr(self, k)
            if isinstance(mine, Counter):
                mine.update(v)
            else:
                mine.extend(v)

    def summary_lines(self) -> list[str]:
        lines = []
        if self.examples:
            lines.append("hypothesis examples run:")
            for k, v in sorted(self.examples.items()):
                lines.append(f"  {k}: {v} examples ({self.seconds[k]:.1f}s in the test bodies)")
            lines.append(f"  total: {sum(self.examples.values())} examples")
            for k, v in sorted(self.traded.items()):
                lines.append(f"  {k}: {v} plans traded bytes for launches (bounded by modelled time)")
            if self.reference_checked:
                lines.append(
                    f"  {len(self.reference_checked)} checked against the independent reference "
                    "(torch failed inside the LocalTensorMode simulation)"
                )
        if self.oracle_artifacts:
            lines.append(
                f"{len(self.oracle_artifacts)} case(s) where torch failed inside the "
                "LocalTensorMode simulation were checked against the independent reference:"
            )
            lines.extend(f"  {a}" for a in sorted(self.oracle_artifacts))
        return lines


REPORT = Report()
