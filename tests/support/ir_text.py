"""IR text in, IR text out: run one pass on a plan written as IR text.

Like XLA's ``RunPass`` tests and MLIR's FileCheck tests, a pass test states its
input as IR text (``redist_opt.ir.text``), runs one pass on it and compares the
whole output text, with expecttest's ``assertExpectedInline``::

    self.assertExpectedInline(run_pass(BEFORE, MergeReductions), '''...''')

Every legality condition has a ``*_not_transformed`` twin: :func:`assert_not_transformed`
checks the pass leaves the text as it was and returns the notes it recorded
(why it did not rewrite), to compare too.

``run_pass`` builds the :class:`PassContext` as ``redist_opt.pipeline`` does
(cost profile resolved from the mesh unless ``cost=`` is given, the pipeline
being the one pass) and runs the IR verifier after a pass that changed the IR.
"""

from __future__ import annotations

import dataclasses

import redist_opt
from redist_opt import ir
from redist_opt.ir.cost import resolve as resolve_cost
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.parse import parse_ir
from redist_opt.ir.text import format_ir
from redist_opt.passes import PassContext

__all__ = [
    "parse_ir",
    "format_ir",
    "run_pass",
    "run_pass_notes",
    "assert_not_transformed",
    "assert_round_trips",
    "PassRun",
    "signature",
    "notes_of",
    "mesh",
]


@dataclasses.dataclass(frozen=True)
class PassRun:
    """What one pass did to a plan: the IR text after it, whether it changed the IR, its notes."""

    text: str
    modified: bool
    notes: tuple[str, ...]


def run(text: str, pass_cls, *, groups="existing", cost=None, prefer="time", pipeline=None) -> PassRun:
    """Parse ``text``, run ``pass_cls`` alone on it, verify, and print the result.

    Both the input and the output must round-trip (print as they parse).
    """
    plan = parse_ir(text)
    assert_round_trips(text)
    if cost is None:
        cost, _ = resolve_cost(plan.mesh)
    ctx = PassContext(
        mesh=plan.mesh,
        shape=plan.shape,
        src=plan.src,
        dtype=plan.dtype,
        options=PlanOptions(groups=groups, cost=cost, prefer=prefer),
        pipeline=tuple(pipeline) if pipeline is not None else (pass_cls,),
    )
    result = pass_cls(ctx)(plan.graph)
    if result.modified:
        ir.verify(result.graph_module, plan.mesh.sizes, ir.local_shape(plan.shape, plan.dst, plan.mesh.sizes))
    out = format_ir(plan.replace(graph=result.graph_module))
    assert_round_trips(out)
    return PassRun(out, bool(result.modified), tuple(str(n) for n in ctx.notes))


def assert_round_trips(text: str) -> None:
    """``text`` is IR text as the printer writes it: it parses and prints back the same."""
    again = format_ir(parse_ir(text))
    assert again == text.strip("\n"), f"IR text does not round-trip; printed back as:\n{again}"


def run_pass(text: str, pass_cls, **ctx_options) -> str:
    """The IR text after running ``pass_cls`` on ``text`` (``ctx_options``: PassContext's)."""
    return run(text, pass_cls, **ctx_options).text


def run_pass_notes(text: str, pass_cls, **ctx_options) -> str:
    """The notes (one a line) ``pass_cls`` recorded on ``text``: rewrites made and declined."""
    return "\n".join(run(text, pass_cls, **ctx_options).notes)


def assert_not_transformed(text: str, pass_cls, **ctx_options) -> str:
    """Assert ``pass_cls`` leaves ``text`` as it is; return its notes (one a line)."""
    r = run(text, pass_cls, **ctx_options)
    assert not r.modified, f"{pass_cls.name} changed the IR:\n{r.text}"
    assert r.text == text.strip("\n"), f"{pass_cls.name} changed the IR text:\n{r.text}"
    return "\n".join(r.notes)


def signature(plan) -> list[str]:
    """A plan's collectives as ``kind[op](dims)`` (for tests that run whole pipelines)."""
    out = []
    for c in plan.collectives():
        op = f"[{c.reduce_op}]" if c.reduce_op else ""
        out.append(f"{c.kind}{op}({c.group.name(plan.mesh)})")
    return out


def notes_of(plan, pass_cls) -> list[str]:
    """The notes ``pass_cls`` recorded on an optimized plan."""
    return [str(n) for n in plan.notes if n.pass_name == pass_cls.name]


def mesh(sizes, flattened=(), names=None):
    """A rank-free MeshSpec with dims named a, b, c, ... unless ``names`` are given."""
    names = names or tuple("abcdefgh"[: len(sizes)])
    return redist_opt.MeshSpec(sizes=sizes, names=names, flattened=flattened)
