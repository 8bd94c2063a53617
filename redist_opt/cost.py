"""Alpha-beta cost model of collectives over mesh groups.

Interface used by the passes (keep it stable):

    model = CostModel.default()            # NCCL-like profile
    model = CostModel.profile("gloo")      # measured-on-CPU-like profile
    model = CostModel.load(path)           # written by `redist-opt calibrate`
    model.collective_time(kind, group, nbytes, mesh) -> seconds
        kind: "all_reduce" | "reduce_scatter" | "all_gather" | "all_to_all"
        group: MeshGroup; nbytes: bytes each rank feeds in; mesh: MeshSpec
    model.plan_time(plan) -> seconds       # sum over the plan's collectives
    model.group_creation_time(group, mesh) -> seconds (paid once under groups="create")
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["CostModel"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    name: str = "nccl"
    # Per collective launch (kernel launch / op dispatch), seconds.
    launch: float = 10e-6
    # Per algorithm step latency, seconds, intra-host and inter-host.
    alpha_intra: float = 2e-6
    alpha_inter: float = 10e-6
    # Bandwidth per rank, bytes/second, intra-host and inter-host.
    bw_intra: float = 150e9
    bw_inter: float = 25e9
    # Ranks per host (consecutive ranks share a host); None: all on one host.
    devices_per_host: int | None = 8
    # "ring" pays 2(p-1) latency steps per all_reduce, "tree" about 2*log2(p).
    algorithm: str = "tree"
    # One-off cost of creating a communicator, and the reuse it is amortized over.
    create_group: float = 50e-3
    expected_reuse: int = 1000

    @classmethod
    def default(cls) -> "CostModel":
        return cls()

    @classmethod
    def profile(cls, name: str) -> "CostModel":
        if name == "nccl":
            return cls()
        if name == "gloo":
            # Measured order of magnitude on this CPU (8 processes, 2 cores):
            # ring algorithms, high per-step latency, memory-bound bandwidth.
            return cls(
                name="gloo",
                launch=30e-6,
                alpha_intra=60e-6,
                alpha_inter=60e-6,
                bw_intra=1.5e9,
                bw_inter=1.5e9,
                devices_per_host=None,
                algorithm="ring",
                create_group=20e-3,
            )
        raise ValueError(f"unknown cost profile {name!r} (known: nccl, gloo)")

    def _link(self, group, mesh) -> tuple[float, float]:
        """(alpha, bandwidth) of the slowest link the group spans."""
        if self.devices_per_host is None or mesh is None:
            return self.alpha_intra, self.bw_intra
        # A group stays within a host when every member's rank index lies in the
        # same block of devices_per_host consecutive indices: its span (the
        # largest index offset) is below the host size and it is aligned.
        span = sum((s - 1) * d for s, d in zip(group.layout.shape, group.layout.stride))
        if span < self.devices_per_host and all(
            d < self.devices_per_host for d in group.layout.stride
        ) and self.devices_per_host % max(1, span + 1) == 0:
            return self.alpha_intra, self.bw_intra
        return self.alpha_inter, self.bw_inter

    def collective_time(self, kind: str, group, nbytes: int, mesh=None) -> float:
        p = group.size
        if p <= 1:
            return 0.0
        alpha, bw = self._link(group, mesh)
        if kind == "all_reduce":
            steps = 2 * (p - 1) if self.algorithm == "ring" else 2 * math.ceil(math.log2(p))
            moved = 2 * nbytes * (p - 1) / p
        elif kind == "reduce_scatter":
            steps = p - 1 if self.algorithm == "ring" else math.ceil(math.log2(p))
            moved = nbytes * (p - 1) / p
        elif kind == "all_gather":
            steps = p - 1 if self.algorithm == "ring" else math.ceil(math.log2(p))
            moved = nbytes * (p - 1)
        elif kind == "all_to_all":
            steps = p - 1
            moved = nbytes * (p - 1) / p
        else:
            raise ValueError(f"unknown collective kind {kind!r}")
        return self.launch + steps * alpha + moved / bw

    def group_creation_time(self, group, mesh=None) -> float:
        return self.create_group / max(1, self.expected_reuse)

    def plan_time(self, plan) -> float:
        return sum(
            self.collective_time(c.kind, c.group, c.bytes_in, plan.mesh) for c in plan.collectives()
        )
