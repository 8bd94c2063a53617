"""Dumps of plans: text and per-pass dump files.

Text
----
:func:`format_plan` (what ``str(plan)`` prints): the request, one line per
collective (kind, reduce op, group as dim names and CuTe layout, bytes in per
rank), the passes that changed the plan and their notes, then the IR, one op a
line, with provenance (``# <- %a, %b``: the nodes a pass rewrote into this one).

explain
-------
The ``redist-opt explain`` report (text and JSON) is in :mod:`redist_opt.debug.explain`.

Per-pass dumps
--------------
Like XLA's ``--xla_dump_to``: :func:`write_pass_dump` writes
``NNNN.<pipeline>.before_pipeline.{txt,dot}`` and
``NNNN.<pipeline>.after_<pass-name>.{txt,dot}``; the pipeline calls it before
the first pass and after each pass that changed the IR, when
:func:`dump_dir_from_env` names a directory (``REDIST_OPT_DUMP_DIR``).
``REDIST_OPT_DUMP_PASSES`` is an optional regex: only passes whose name it
matches (``re.search``) are dumped (``before_pipeline`` always is). ``diff`` two
consecutive ``.txt`` files to see what a pass did.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from redist_opt import ir
from redist_opt.ir import layout as L
from redist_opt.ir import symbolic as sym
from redist_opt.ir.placements import placement_str, placements_str
from redist_opt.debug.dot import plan_to_dot

__all__ = [
    "format_plan",
    "format_graph",
    "write_pass_dump",
    "dump_dir_from_env",
    "dump_pass_filter_from_env",
    "pass_selected",
    "plan_tag",
    "DUMP_DIR_ENV",
    "DUMP_PASSES_ENV",
]

DUMP_DIR_ENV = "REDIST_OPT_DUMP_DIR"
DUMP_PASSES_ENV = "REDIST_OPT_DUMP_PASSES"


# -- plain plan dumps ------------------------------------------------------------


def _arg_str(a, names) -> str:
    if isinstance(a, sym.sympy.Basic):
        return sym.expr_str(a, names)
    if hasattr(a, "layout") and hasattr(a, "dims"):
        return "{" + "+".join(names.get(d, str(d)) for d in a.dims) + f" {L.format_layout(a.layout)}" + "}"
    if isinstance(a, tuple):
        inner = ", ".join(_arg_str(x, names) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(_arg_str(x, names) for x in a) + "]"
    return repr(a) if isinstance(a, str) else str(a)


def format_graph(plan) -> str:
    """One line per IR op: ``%name = op(args) : (local shape)  # <- %provenance``."""
    names = plan.mesh.dim_names_by_index()
    lines = []
    for node in plan.graph.graph.nodes:
        if node.op == "placeholder":
            shape = ", ".join(sym.expr_str(s, names) for s in node.meta["shape"])
            lines.append(f"%{node.name} : ({shape})")
        elif node.op == "output":
            lines.append(f"return %{node.args[0].name}")
        else:
            args = ", ".join(_arg_str(a, names) for a in node.args[1:])
            shape = ", ".join(sym.expr_str(s, names) for s in node.meta["shape"])
            line = f"%{node.name} = {ir.ir_name(node)}(%{node.args[0].name}, {args}) : ({shape})"
            src = ir.from_nodes(node)
            if src:
                line += "  # <- " + ", ".join("%" + s for s in src)
            lines.append(line)
    return "\n".join(lines)


def _head(plan) -> str:
    return (
        f"redistribute {placements_str(plan.src)} -> {placements_str(plan.dst)} "
        f"on mesh ({plan.mesh.shape_str}), shape {tuple(plan.shape)}, {_dtype_str(plan.dtype)}"
    )


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


def format_plan(plan) -> str:
    """The plan as text (``str(plan)``): request, collectives, passes and notes, IR."""
    head = _head(plan)
    if plan.fallback:
        return head + f"\n  runs through torch's own path: {plan.fallback_reason}"
    colls = plan.collectives()
    lines = [head, f"  {len(colls)} collective(s), {plan.bytes_per_rank} bytes in per rank (max)"]
    for c in colls:
        op = f" {c.reduce_op}" if c.reduce_op else ""
        lines.append(
            f"  - {c.kind}{op} over {c.group.name(plan.mesh)} "
            f"[{L.format_layout(c.group.layout)}], {c.bytes_in} B in"
        )
    if plan.applied_passes:
        lines.append("  passes that changed the plan: " + ", ".join(plan.applied_passes))
    if plan.cost_profile:
        lines.append(f"  cost model: {plan.cost_profile}")
    for note in plan.notes:
        lines.append("  " + _note_str({"pass": note.pass_name, "made": note.made, "what": note.what, "reason": note.reason}))
    lines.append(format_graph(plan))
    return "\n".join(lines)


def _note_str(note: dict) -> str:
    """``+ [pass] what: reason`` for a rewrite made, ``- [pass] what: not made: reason`` otherwise."""
    if note["made"]:
        return f"+ [{note['pass']}] {note['what']}: {note['reason']}"
    return f"- [{note['pass']}] {note['what']}: not made: {note['reason']}"


# -- per-pass dumps ----------------------------------------------------------------


def dump_dir_from_env() -> Path | None:
    """The directory named by ``REDIST_OPT_DUMP_DIR``, or None when unset or empty."""
    value = os.environ.get(DUMP_DIR_ENV, "").strip()
    return Path(value) if value else None


def dump_pass_filter_from_env() -> re.Pattern | None:
    """The compiled ``REDIST_OPT_DUMP_PASSES`` regex, or None when unset or empty."""
    value = os.environ.get(DUMP_PASSES_ENV, "")
    if not value:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError(f"{DUMP_PASSES_ENV}={value!r} is not a valid regular expression: {e}") from None


def pass_selected(pass_name: str | None) -> bool:
    """True when ``pass_name`` should be dumped under ``REDIST_OPT_DUMP_PASSES``."""
    stage = _stage(pass_name)
    if stage == "before_pipeline":
        return True
    pattern = dump_pass_filter_from_env()
    return pattern is None or pattern.search(stage[len("after_"):]) is not None


def _stage(pass_name: str | None) -> str:
    if pass_name in (None, "", "before_pipeline"):
        return "before_pipeline"
    if pass_name.startswith("after_"):
        return pass_name
    return f"after_{pass_name}"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def plan_tag(plan) -> str:
    """A file-name-safe tag naming a plan's request, e.g. ``a2-b2-c2_P-P-P_to_R-S0-R_8x4_float32``.

    For ``pipeline=`` in :func:`write_pass_dump` when one process dumps many plans
    (library use): without it every plan's ``0000.default.before_pipeline.txt``
    would overwrite the last one's.
    """

    def pl(p) -> str:
        return re.sub(r"[^A-Za-z0-9]", "", placement_str(p))

    mesh = "-".join(f"{plan.mesh.dim_name(d)}{s}" for d, s in enumerate(plan.mesh.sizes))
    src = "-".join(pl(p) for p in plan.src)
    dst = "-".join(pl(p) for p in plan.dst)
    shape = "x".join(map(str, plan.shape)) or "scalar"
    return _UNSAFE.sub("_", f"{mesh}_{src}_to_{dst}_{shape}_{_dtype_str(plan.dtype)}")


def write_pass_dump(directory, seq: int, pipeline: str, pass_name: str | None, plan) -> list[Path]:
    """Write ``NNNN.<pipeline>.<stage>.txt`` and ``.dot`` for ``plan``; return the paths.

    ``pass_name`` is the kebab-case pass name (the stage is ``after_<pass_name>``),
    or ``None`` / ``"before_pipeline"`` for the IR before the first pass.
    Returns ``[]`` (writes nothing) for a pass ``REDIST_OPT_DUMP_PASSES`` filters out.
    The ``.txt`` is :func:`format_plan`; the ``.dot`` is the IR graph.
    """
    if not pass_selected(pass_name):
        return []
    stage = _stage(pass_name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{int(seq):04d}.{_UNSAFE.sub('_', pipeline)}.{_UNSAFE.sub('_', stage)}"
    txt = directory / f"{stem}.txt"
    dot = directory / f"{stem}.dot"
    txt.write_text(format_plan(plan) + "\n", encoding="utf-8")
    dot.write_text(plan_to_dot(plan, name=stem), encoding="utf-8")
    return [txt, dot]
