"""The parser of the IR text ``redist_opt.ir.text.format_ir`` prints.

``parse_ir(format_ir(p))`` is a plan that prints as ``p`` does and behaves as ``p``
under every pass: same mesh (sizes, names, flattened groups, backend, layouts),
request, node names, op arguments, local shapes, provenance and step metadata
(one ``StepInfo`` object per ``step`` block, as ``steps.regions`` groups nodes).
The format is described in ``redist_opt.ir.text``.
"""

from __future__ import annotations

import ast
import re

import sympy
import torch
import torch.fx as fx
from sympy.parsing.sympy_parser import parse_expr

from redist_opt.ir import layout as L
from redist_opt.ir import ops
from redist_opt.ir import symbolic as sym
from redist_opt.ir.layout_algebra import FlatLayout
from redist_opt.ir.mesh import MeshGroup, MeshSpec
from redist_opt.ir.placements import parse_placement
from redist_opt.ir.plan import Plan
from redist_opt.ir.text import shape_str
from redist_opt.torch_api.tracing import LazyGraphModule

__all__ = ["parse_ir", "IRParseError", "build_step", "split_top_level"]


class IRParseError(ValueError):
    """The text is not valid IR; the message names the line."""


_HEAD_RE = re.compile(r"redistribute (\[.*\]) -> (\[.*\]) on mesh \((.*)\), shape \((.*)\), (\w+)$")
_STEP_RE = re.compile(r"step (\d+) over (\S+): (\S+) -> (\S+), logical=(\(.*?\))((?:, \w+=.*)?)$")
_NODE_RE = re.compile(r"%(\w+) = (\w+)\(%(\w+)(.*)\)$")
_PLACEHOLDER_RE = re.compile(r"%(\w+) : (\(.*\))$")


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes; empty pieces dropped."""
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0 and not quote:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


class _Reader:
    """Parses one plan's text; holds the mesh once the header is read."""

    def __init__(self) -> None:
        self.mesh: MeshSpec | None = None
        self.symbols: dict = {}

    # -- pieces ------------------------------------------------------------------

    def expr(self, text: str):
        if re.fullmatch(r"-?\d+", text):
            return sym.as_expr(int(text))
        local = {"chunk": sym.ChunkSize, "ceildiv": sym.CeilDiv, **self.symbols}
        e = parse_expr(
            text,
            local_dict=local,
            global_dict={
                "Integer": sympy.Integer,
                "Max": sympy.Max,
                "Min": sympy.Min,
                "Symbol": sympy.Symbol,
                "Mul": sympy.Mul,
                "Add": sympy.Add,
                "Rational": sympy.Rational,
            },
        )
        unknown = e.free_symbols - set(self.symbols.values())
        if unknown:
            raise IRParseError(f"unknown name(s) {sorted(map(str, unknown))} in {text!r}")
        return e

    def shape(self, text: str) -> tuple:
        if not (text.startswith("(") and text.endswith(")")):
            raise IRParseError(f"expected a shape in parentheses, got {text!r}")
        return tuple(self.expr(p) for p in split_top_level(text[1:-1]))

    def group(self, text: str) -> MeshGroup:
        dims, _, layout = text[1:-1].partition(" ")
        group = self.mesh.group(self.mesh.dims_of(dims))
        if L.format_layout(group.layout) != layout:
            raise IRParseError(
                f"group {text}: mesh dims {dims} have layout {L.format_layout(group.layout)}, not {layout}"
            )
        return group

    def arg(self, text: str):
        if text[0] in "'\"":
            return ast.literal_eval(text)
        if text[0] == "{":
            return self.group(text)
        if text[0] == "[" and text[-1] == "]":
            return [self.arg(p) for p in split_top_level(text[1:-1])]
        if text[0] == "(" and text[-1] == ")":
            inner = text[1:-1]
            parts = split_top_level(inner)
            if not parts or len(parts) > 1 or inner.rstrip().endswith(","):
                return tuple(self.arg(p) for p in parts)
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if re.fullmatch(r"-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf)", text):
            return float(text)  # a norm's p, a float divisor: exact (repr round-trips)
        return self.expr(text)

    def layout(self, text: str):
        shape, stride = text.split(":")
        ints = lambda s: tuple(int(x) for x in s.strip("()").split(","))  # noqa: E731
        return FlatLayout(ints(shape), ints(stride))

    # -- lines -------------------------------------------------------------------

    def header(self, line: str):
        m = _HEAD_RE.match(line)
        if not m:
            raise IRParseError(
                f"expected 'redistribute SRC -> DST on mesh (...), shape (...), dtype', got {line!r}"
            )
        src, dst, mesh, shape, dtype = m.groups()
        if "=" in mesh:
            pairs = [p.split("=") for p in mesh.split(",")]
            names, sizes = tuple(n for n, _ in pairs), tuple(int(s) for _, s in pairs)
        else:
            names, sizes = None, tuple(int(s) for s in mesh.split("x"))
        placements = lambda s: tuple(parse_placement(p) for p in split_top_level(s[1:-1]))  # noqa: E731
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise IRParseError(f"unknown dtype {dtype!r}")
        shape = tuple(int(s) for s in split_top_level(shape))
        return (names, sizes), placements(src), placements(dst), shape, dt

    def mesh_options(self, line: str) -> dict:
        out = {}
        for item in split_top_level(line[len("mesh ") :], " "):
            key, _, value = item.partition("=")
            if key == "flattened":
                out[key] = tuple(self.layout(g) if ":" in g else g for g in split_top_level(value[1:-1]))
            elif key == "layouts":
                out["dim_layouts"] = tuple(self.layout(g) for g in split_top_level(value[1:-1]))
            elif key == "backend":
                out[key] = value
            elif key == "index_space":
                out[key] = int(value)
            elif key in ("ranks_ascending", "preserve_rank_order"):
                out[key] = value == "True"
            else:
                raise IRParseError(f"unknown mesh option {key!r}")
        return out

    def step(self, line: str) -> ops.StepInfo:
        m = _STEP_RE.match(line)
        if not m:
            raise IRParseError(
                "expected 'step INDEX over DIMS: SRC -> DST, logical=(...)[, avg_scale=N][, variant=...]', "
                f"got {line!r}"
            )
        index, dims, src, dst, logical, rest = m.groups()
        fields = dict(
            index=int(index),
            mesh_dims=self.mesh.dims_of(dims),
            src=parse_placement(src),
            dst=parse_placement(dst),
            logical_shape=self.shape(logical),
        )
        variant = None
        for item in split_top_level(rest):
            key, _, value = item.partition("=")
            if key == "avg_scale":
                fields["avg_scale"] = int(value)
            elif key == "variant":
                variant = value
            else:
                raise IRParseError(f"unknown step field {key!r} in {line!r}")
        return build_step(fields, variant, self.mesh)


def build_step(fields: dict, variant: str | None, mesh: MeshSpec) -> ops.StepInfo:
    """A ``StepInfo`` from its parsed fields and ``variant=NAME(ITEM, ...)`` text (or None)."""
    if variant is None:
        return ops.StepInfo(**fields)
    m = re.fullmatch(r"(\w+)\((.*)\)", variant)
    if not m or m.group(1) not in ops.STEP_VARIANTS:
        raise IRParseError(f"unknown step variant {variant!r}; known: {sorted(ops.STEP_VARIANTS)}")
    items = [tuple(s.strip() for s in item.split(":", 1)) for item in split_top_level(m.group(2))]
    parts = tuple((int(t), mesh.dims_of(dims)) for t, dims in items)
    return ops.StepInfo(**fields, variant=m.group(1), parts=parts)


def parse_ir(text: str):
    """The plan :func:`format_ir` printed as ``text``."""
    from_lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [(i + 1, ln) for i, ln in enumerate(from_lines) if ln.strip() and not ln.lstrip().startswith("#")]
    try:
        return _parse(lines)
    except IRParseError:
        raise
    except (ValueError, KeyError, TypeError, SyntaxError) as e:
        raise IRParseError(f"bad IR text: {e}") from e


def _parse(lines):
    r = _Reader()
    if not lines:
        raise IRParseError("empty IR text")
    (names, sizes), src, dst, shape, dtype = r.header(lines[0][1])
    rest = lines[1:]
    options = {}
    if rest and rest[0][1].startswith("mesh "):
        options = r.mesh_options(rest[0][1])
        rest = rest[1:]
    r.mesh = MeshSpec(sizes=sizes, names=names, **options)
    r.symbols = {f"c_{r.mesh.dim_name(d)}": sym.coord(d) for d in range(r.mesh.ndim)}
    if rest and rest[0][1].startswith("fallback: "):
        reason = rest[0][1][len("fallback: ") :]
        return Plan(r.mesh, src, dst, shape, dtype, (), None, fallback_reason=reason)
    gm, steps = _parse_graph(r, rest)
    return Plan(r.mesh, src, dst, shape, dtype, steps, gm)


def _parse_graph(r: _Reader, lines):
    graph = fx.Graph()
    values: dict[str, fx.Node] = {}
    steps: list = []
    step = None
    for lineno, raw in lines:
        line = raw.strip()
        try:
            if line.startswith("step "):
                step = r.step(line)
                steps.append(step)
            elif line.startswith("return "):
                graph.output(values[line[len("return %") :]])
            elif _PLACEHOLDER_RE.match(line) and not values:
                name, shape = _PLACEHOLDER_RE.match(line).groups()
                node = graph.placeholder(name)
                node.meta["shape"] = r.shape(shape)
                values[name] = node
            else:
                node = _parse_node(r, graph, values, line, step if raw.startswith("  ") else None)
                values[node.name] = node
        except (IRParseError, ValueError, KeyError, TypeError, SyntaxError) as e:
            raise IRParseError(f"line {lineno}: {raw.strip()!r}: {e}") from e
    return LazyGraphModule(torch.nn.Module(), graph), tuple(steps)


def _parse_node(r: _Reader, graph: fx.Graph, values, line: str, step) -> fx.Node:
    line, _, provenance = line.partition("  # <- ")
    shape = None
    if " : " in line:
        line, _, shape = line.rpartition(" : ")
    m = _NODE_RE.match(line)
    if not m:
        raise IRParseError("expected '%name = op(%input, args) : (shape)'")
    name, op_name, inp, args = m.groups()
    if op_name not in ops.OPS:
        raise IRParseError(f"unknown op {op_name!r}; known: {sorted(ops.OPS)}")
    prev = values[inp]
    params = tuple(r.arg(a) for a in split_top_level(args.lstrip(", ")))
    node = graph.create_node("call_function", ops.OPS[op_name], (prev, *params), {}, name=name)
    if node.name != name:
        raise IRParseError(f"node name %{name} is taken")
    derived = tuple(sym.as_expr(s) for s in ops.OPS[op_name].shape_fn(prev.meta["shape"], *params))
    if shape is not None and r.shape(shape) != derived:
        raise IRParseError(f"shape {shape} != {shape_str(derived, r.mesh.dim_names_by_index())} derived")
    node.meta["shape"] = derived
    node.meta["step"] = step
    if provenance:
        node.meta["from_node"] = tuple(p.strip().lstrip("%") for p in provenance.split(","))
    return node
