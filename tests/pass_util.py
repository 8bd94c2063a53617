"""IR in, IR out: run one pass on a small plan and compare its collectives.

``run_and_check(plan, pass_cls, expected)`` runs ``pass_cls`` alone on the plan's
IR (the verifier runs after it, as in the pipeline) and compares the resulting
collectives, written ``kind[op](dims)``, with ``expected``; ``expected=None``
asserts the pass changed nothing. Each legality condition of a pass has a
``*_not_transformed`` twin in that pass's test file.
"""

from __future__ import annotations

import redist_opt
from redist_opt import ir
from redist_opt.pipeline import run_pipeline


def mesh(sizes, flattened=(), names=None):
    names = names or tuple("abcdefgh"[: len(sizes)])
    return redist_opt.MeshSpec(sizes=sizes, names=names, flattened=flattened)


def signature(plan) -> list[str]:
    out = []
    for c in plan.collectives():
        op = f"[{c.reduce_op}]" if c.reduce_op else ""
        out.append(f"{c.kind}{op}({c.group.name(plan.mesh)})")
    return out


def run_pass(plan, pass_cls, **options):
    return run_pipeline(plan, passes=[pass_cls], **options)


def run_and_check(plan, pass_cls, expected, **options):
    after = run_pass(plan, pass_cls, **options)
    if expected is None:
        assert pass_cls.name not in after.applied_passes, (
            f"{pass_cls.name} changed the plan: {signature(plan)} -> {signature(after)}"
        )
        assert signature(after) == signature(plan)
    else:
        assert pass_cls.name in after.applied_passes, f"{pass_cls.name} did not change the plan"
        assert signature(after) == expected
    ir.verify(after.graph, plan.mesh.sizes, ir.local_shape(plan.shape, plan.dst, plan.mesh.sizes))
    return after


def notes_of(plan, pass_cls) -> list[str]:
    return [str(n) for n in plan.notes if n.pass_name == pass_cls.name]
