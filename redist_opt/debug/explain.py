"""The ``redist-opt explain`` report: a naive and an optimized plan, their cost, and why.

:func:`explain_data` gathers everything ``redist-opt explain`` shows about a
naive and an optimized plan into one JSON-able dict (``explain --format json``
prints it); :func:`format_explain` renders it as text.

JSON schema ``redist_opt.explain/1`` (stable: fields are only ever added; a
change to the meaning of a field bumps the version)::

    {
      "schema": "redist_opt.explain/1",
      "request": {
        "mesh": {"sizes": [2, 2, 2], "names": ["a", "b", "c"],
                 "num_ranks": 8, "flattened": ["a+c"]},   # flattened groups that exist
        "src": ["P", "P", "P"], "dst": ["R", "S(0)", "R"],  # one placement string per mesh dim
        "shape": [8, 4], "dtype": "float32",
        "groups": "existing"                               # groups policy, or null if unknown
      },
      "cost_model": {"name": "nccl", "devices_per_host": 8, "algorithm": "tree",
                     "source": "mesh backend nccl"}    # where the profile came from
                    # or null when no model was given (then every "time_s" is null)
      "plans": {"naive": PLAN, "optimized": PLAN},
      "ratio": {"collectives": 1.5, "bytes_per_rank": 1.67, "time": 1.5},
                    # naive / optimized; null where the optimized value is 0
      "notes": [NOTE, ...]                                 # the optimized plan's notes
    }
    PLAN = {
      "fallback_reason": null,            # or why the plan runs through torch's own path
      "applied_passes": ["merge-reductions"],
      "num_collectives": 2,
      "bytes_per_rank": 192,              # sum over collectives of the largest input any rank sends
      "time_s": 2.4e-05,                  # modelled, sum over collectives; null without a model
      "collectives": [COLLECTIVE, ...],
      "ir": [IR_NODE, ...]                # [] for a fallback plan
    }
    COLLECTIVE = {
      "index": 1,                         # 1-based position in the plan
      "node": "all_reduce",               # IR node name
      "kind": "all_reduce",               # all_reduce | reduce_scatter | all_gather | all_to_all
      "reduce_op": "sum",                 # null for gathers and all_to_all
      "group": {
        "dims": ["a", "c"],               # mesh dim names, in group order (first slowest)
        "dim_indices": [0, 2],
        "size": 4,                        # ranks per group
        "layout": "(2,2):(4,1)",          # collapsed CuTe layout sizes:strides
        "layout_shape": [2, 2], "layout_stride": [4, 1],
        "num_groups": 2,                  # groups the layout tiles the mesh into
        "rank_lists": [[0, 1, 4, 5], [2, 3, 6, 7]],   # the first few groups (rank indices)
        "exists": true                    # a dim's group or a flattened group that exists
      },
      "bytes_per_rank": 128,
      "time_s": 1.2e-05,                  # null without a cost model
      "from_nodes": ["all_reduce", "all_reduce_1"]    # provenance; [] when not rewritten
    }
    IR_NODE = {"name": "all_reduce", "op": "all_reduce",   # op: an IR op, "input" or "output"
               "args": ["a+c (2,2):(4,1)", "'sum'"],       # rendered arguments after the tensor
               "inputs": ["x"], "shape": ["8", "4"],       # local shape after the op (expressions)
               "from_nodes": []}
    NOTE = {"pass": "merge-reductions", "made": true,
            "what": "all_reduce(a) + all_reduce(c) -> all_reduce(a+c)",
            "reason": "..."}
"""

from __future__ import annotations

from collections.abc import Sequence

from redist_opt import ir
from redist_opt.debug.units import format_bytes, format_time
from redist_opt.ir import layout as L
from redist_opt.ir import symbolic as sym
from redist_opt.ir.layout_algebra import FlatLayout
from redist_opt.ir.placements import placement_str
from redist_opt.ir.text import arg_str as _arg_str
from redist_opt.ir.text import dtype_str as _dtype_str
from redist_opt.ir.text import format_graph
from redist_opt.ir.text import head as _head
from redist_opt.ir.text import note_str as _note_str

__all__ = ["explain_data", "format_explain", "SCHEMA", "DEFAULT_RANK_LIMIT"]

SCHEMA = "redist_opt.explain/1"
DEFAULT_RANK_LIMIT = 2


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def _flattened_names(mesh) -> list[str]:
    out = []
    for g in mesh.flattened:
        if isinstance(g, FlatLayout):
            out.append(L.format_layout(g))
        else:
            out.append("+".join(mesh.dim_name(d) for d in mesh.dims_of(g)))
    return out


def _group_data(group, mesh, rank_limit: int) -> dict:
    return {
        "dims": [mesh.dim_name(d) for d in group.dims],
        "dim_indices": list(group.dims),
        "size": group.size,
        "layout": L.format_layout(group.layout),
        "layout_shape": [int(s) for s in group.layout.shape],
        "layout_stride": [int(s) for s in group.layout.stride],
        "num_groups": mesh.num_ranks // max(1, group.size),
        "rank_lists": [
            list(map(int, r)) for r in L.rank_lists(group.layout, mesh.index_space, limit=rank_limit)
        ]
        if rank_limit > 0
        else [],
        "exists": bool(mesh.group_exists(group)),
    }


def _ir_data(plan) -> list[dict]:
    if plan.graph is None:
        return []
    names = plan.mesh.dim_names_by_index()
    out = []
    for node in plan.graph.graph.nodes:
        if node.op == "placeholder":
            op, args = "input", []
        elif node.op == "output":
            op, args = "output", []
        else:
            op, args = ir.ir_name(node), [_arg_str(a, names).strip("{}") for a in node.args[1:]]
        out.append(
            {
                "name": node.name,
                "op": op,
                "args": args,
                "inputs": [n.name for n in node.all_input_nodes],
                "shape": [sym.expr_str(s, names) for s in node.meta.get("shape", ())],
                "from_nodes": list(ir.from_nodes(node)),
            }
        )
    return out


def _plan_data(plan, cost_model, rank_limit: int) -> dict:
    colls = []
    total_time = 0.0 if cost_model is not None else None
    by_name = {n.name: n for n in plan.graph.graph.nodes} if plan.graph is not None else {}
    for i, c in enumerate(plan.collectives(), 1):
        t = None
        if cost_model is not None:
            t = float(cost_model.collective_time(c.kind, c.group, c.bytes_in, plan.mesh))
            total_time += t
        colls.append(
            {
                "index": i,
                "node": c.node,
                "kind": c.kind,
                "reduce_op": c.reduce_op,
                "group": _group_data(c.group, plan.mesh, rank_limit),
                "bytes_per_rank": int(c.bytes_in),
                "time_s": t,
                "from_nodes": list(ir.from_nodes(by_name[c.node])) if c.node in by_name else [],
            }
        )
    return {
        "fallback_reason": plan.fallback_reason,
        "applied_passes": list(plan.applied_passes),
        "num_collectives": len(colls),
        "bytes_per_rank": sum(c["bytes_per_rank"] for c in colls),
        "time_s": total_time,
        "collectives": colls,
        "ir": _ir_data(plan),
    }


def explain_data(
    naive,
    optimized,
    *,
    cost_model=None,
    groups: str | None = None,
    rank_limit: int = DEFAULT_RANK_LIMIT,
    cost_source: str | None = None,
) -> dict:
    """Everything ``explain`` reports, as a JSON-able dict (schema in the module docstring)."""
    mesh = naive.mesh
    cm = None
    if cost_model is not None:
        cm = {
            "name": getattr(cost_model, "name", type(cost_model).__name__),
            "devices_per_host": getattr(cost_model, "devices_per_host", None),
            "algorithm": getattr(cost_model, "algorithm", None),
            "source": cost_source or _cost_source(optimized, cost_model),
        }
    n = _plan_data(naive, cost_model, rank_limit)
    o = _plan_data(optimized, cost_model, rank_limit)
    return {
        "schema": SCHEMA,
        "request": {
            "mesh": {
                "sizes": list(mesh.sizes),
                "names": [mesh.dim_name(d) for d in range(mesh.ndim)],
                "num_ranks": mesh.num_ranks,
                "flattened": _flattened_names(mesh),
            },
            "src": [placement_str(p) for p in naive.src],
            "dst": [placement_str(p) for p in naive.dst],
            "shape": [int(s) for s in naive.shape],
            "dtype": _dtype_str(naive.dtype),
            "groups": groups if isinstance(groups, str) or groups is None else [str(g) for g in groups],
        },
        "cost_model": cm,
        "plans": {"naive": n, "optimized": o},
        "ratio": {
            "collectives": _ratio(n["num_collectives"], o["num_collectives"]),
            "bytes_per_rank": _ratio(n["bytes_per_rank"], o["bytes_per_rank"]),
            "time": _ratio(n["time_s"], o["time_s"]),
        },
        "notes": [
            {"pass": note.pass_name, "made": bool(note.made), "what": note.what, "reason": note.reason}
            for note in optimized.notes
        ],
    }


def _cost_source(optimized, cost_model) -> str:
    """Where the model came from, as the pipeline recorded it ("gloo (mesh backend gloo)")."""
    rec = getattr(optimized, "cost_profile", None) or ""
    name = getattr(cost_model, "name", "")
    if rec.startswith(f"{name} (") and rec.endswith(")"):
        return rec[len(name) + 2 : -1]
    return "given"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for r in [header, *rows]:
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def _members_str(members: Sequence[int], limit: int = 8) -> str:
    if len(members) > limit:
        members = [*map(str, members[: limit - 2]), "...", str(members[-1])]
    return "[" + ",".join(map(str, members)) + "]"


def _ranks_str(group: dict) -> str:
    shown = " ".join(_members_str(r) for r in group["rank_lists"])
    more = group["num_groups"] - len(group["rank_lists"])
    if more > 0:
        shown += f" +{more} more" if shown else f"{group['num_groups']} groups"
    return shown


def _plan_section(title: str, p: dict, with_time: bool) -> list[str]:
    n = p["num_collectives"]
    if p["fallback_reason"]:
        return [f"{title}: runs through torch's own path: {p['fallback_reason']}"]
    lines = [f"{title}: {n} collective{'s' if n != 1 else ''}"]
    if p["applied_passes"]:
        lines[0] += "; passes that changed it: " + ", ".join(p["applied_passes"])
    if not n:
        return lines
    header = ["#", "collective", "group", "layout", "bytes/rank"] + (["time"] if with_time else [])
    header.append("ranks (first groups)")
    rows = []
    new_groups = False
    for c in p["collectives"]:
        g = c["group"]
        name = "+".join(g["dims"])
        if not g["exists"]:
            name += " *"
            new_groups = True
        row = [
            str(c["index"]),
            c["kind"] + (f" {c['reduce_op']}" if c["reduce_op"] else ""),
            name,
            g["layout"],
            format_bytes(c["bytes_per_rank"]),
        ]
        if with_time:
            row.append(format_time(c["time_s"]))
        row.append(_ranks_str(g))
        rows.append(row)
    total = ["", "total", "", "", format_bytes(p["bytes_per_rank"])]
    if with_time:
        total.append(format_time(p["time_s"]))
    total.append("")
    right = {0, 4, 5} if with_time else {0, 4}
    lines += _table(header, rows + [total], right)
    if new_groups:
        lines.append("  * no process group with this layout exists yet: created on first use")
    return lines


def _ratio_str(r) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def format_explain(
    naive,
    optimized,
    *,
    cost_model=None,
    groups: str | None = None,
    rank_limit: int = DEFAULT_RANK_LIMIT,
    show_ir: bool = True,
    data: dict | None = None,
    cost_source: str | None = None,
) -> str:
    """The text ``redist-opt explain`` prints: both plans, totals and ratio, notes, IR.

    Without ``cost_model`` the time column and the time ratio are left out (the
    golden tests use that, so a recalibrated model does not churn them).
    """
    d = data or explain_data(
        naive, optimized, cost_model=cost_model, groups=groups, rank_limit=rank_limit, cost_source=cost_source
    )
    with_time = d["cost_model"] is not None
    req = d["request"]
    flat = ", ".join(req["mesh"]["flattened"]) or "none"
    lines = [_head(naive)]
    setting = f"flattened groups that exist: {flat}"
    if req["groups"] is not None:
        setting += f"; groups={req['groups']}"
    lines.append(setting)
    if with_time:
        cm = d["cost_model"]
        dph = cm["devices_per_host"]
        hosts = "all ranks on one host" if dph is None else f"{dph} devices per host"
        source = f"; {cm['source']}" if cm.get("source") else ""
        lines.append(f"cost model: {cm['name']} ({cm['algorithm']} algorithms, {hosts}{source})")
    lines.append("")
    lines += _plan_section(
        "naive plan (DTensor's greedy planner, merge pass disabled)", d["plans"]["naive"], with_time
    )
    lines.append("")
    lines += _plan_section("optimized plan", d["plans"]["optimized"], with_time)
    lines.append("")
    r = d["ratio"]
    ratio = (
        f"naive/optimized: {_ratio_str(r['collectives'])} collectives, "
        f"{_ratio_str(r['bytes_per_rank'])} bytes per rank"
    )
    if with_time:
        ratio += f", {_ratio_str(r['time'])} modelled time"
    lines.append(ratio)
    lines.append("")
    if d["notes"]:
        lines.append("notes (+ made, - not made):")
        for note in d["notes"]:
            lines.append("  " + _note_str(note))
    else:
        lines.append("notes: none (no pass recorded a decision)")
    if show_ir:
        for label, plan in (("naive", naive), ("optimized", optimized)):
            if plan.graph is None:
                continue
            lines.append("")
            lines.append(f"IR ({label}):")
            lines += ["  " + s for s in format_graph(plan).splitlines()]
    return "\n".join(lines)
