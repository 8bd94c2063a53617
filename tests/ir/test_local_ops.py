"""The ops' one definition (``redist_opt.ir.local_ops``): every IR local op has it, and
running it eagerly equals emitting it into a graph and running that graph; each collective's
layout around its functional collective gives what torch.chunk and cat give, in both emitters."""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from redist_opt.graph.lower_chains import lower_plan
from redist_opt.graph.lower_ops import Emitter
from redist_opt.ir import symbolic as sym
from redist_opt.ir.local_ops import EAGER, LOCAL_OPS, collective, rank_params, run_local_op
from redist_opt.ir.ops import OPS, GraphBuilder

MESH = (2, 3)
COORDS = list(itertools.product(*(range(n) for n in MESH)))
c0, c1 = sym.coord(0), sym.coord(1)
Ch = sym.ChunkSize

# (id, op, input shape (expressions in c0, c1), params, input transposed (strided))
CASES = [
    ("pad_to_uneven", "pad_to", (Ch(5, 2, c0), 4), (0, 3), False),
    ("pad_to_noop", "pad_to", (4, 6), (1, 6), False),
    ("pad_to_crops", "pad_to", (3, 4), (0, 2), False),
    ("pad_to_strided", "pad_to", (4, Ch(7, 3, c1)), (1, 3), True),
    ("narrow_uneven", "narrow", (3, 4), (0, 0, Ch(5, 2, c0)), False),
    ("narrow_strided", "narrow", (3, 5), (1, 1, 2), True),
    ("narrow_noop", "narrow", (3, 4), (0, 0, 3), False),
    ("select_chunk_uneven", "select_chunk", (7, 5), (0, 3, c1), False),
    ("select_chunk_dim1", "select_chunk", (5, Ch(7, 2, c0)), (1, 3, c1), False),
    ("select_chunk_empty", "select_chunk", (4, 2), (0, 3, c1), False),
    ("select_chunk_even", "select_chunk", (6, 4), (0, 2, c0), True),
    ("pad_nested_uneven", "pad_nested", (7, 2), (0, (2, 3)), False),
    ("pad_nested_even", "pad_nested", (12, 2), (0, (2, 3)), True),
    ("pad_nested_dim1", "pad_nested", (2, Ch(11, 2, c0)), (1, (2, 2)), True),
    ("unpad_nested_uneven", "unpad_nested", (12, 2), (0, 7, (2, 3)), False),
    ("unpad_nested_even", "unpad_nested", (12, 2), (0, 12, (2, 3)), False),
    ("divide_int", "divide", (3, Ch(5, 3, c1)), (4,), False),
    ("divide_float", "divide", (3, 4), (3**0.5,), True),
    ("power", "power", (Ch(5, 2, c0), 3), (2,), False),
    ("power_float", "power", (3, 3), (3.0,), False),
    ("root", "root", (3, Ch(4, 3, c1)), (2,), False),
    ("root_3", "root", (3, 3), (3.0,), True),
    # blocks of an all_gather over counts, unpacked: uneven (sliced) and even (one permute)
    ("unpack_uneven", "unpack_blocks", (18, 3), (0, (2, 3), ((0, (0,)), (1, (1,))), 5, 7), False),
    ("unpack_even", "unpack_blocks", (12, 2), (0, (2, 3), ((0, (0,)), (1, (1,))), 4, 6), False),
    ("unpack_swapped", "unpack_blocks", (18, 3), (0, (3, 2), ((0, (1,)), (1, (0,))), 5, 7), False),
    ("unpack_dim1_even", "unpack_blocks", (2, 12), (1, (2, 2), ((0, (0,)), (1, (1,))), 4, 6), True),
    ("unpack_dim1_uneven", "unpack_blocks", (2, 12), (1, (2, 2), ((0, (0,)), (1, (1,))), 3, 5), False),
    ("unpack_partial_cover", "unpack_blocks", (8, 3), (0, (2, 2), ((0, (1,)),), 4), False),
    ("unpack_nested", "unpack_blocks", (2, 12), (1, (2, 3), ((1, (0, 1)),), 7), True),
    ("unpack_by_coord", "unpack_blocks", (6, 2), (0, (3,), ((0, (0,)),), Ch(9, 2, c0)), False),
]


def test_every_local_op_of_the_ir_has_one_definition():
    local = {name for name, op in OPS.items() if not op.is_collective}
    assert set(LOCAL_OPS) == local, f"no definition in LOCAL_OPS: {sorted(local - set(LOCAL_OPS))}"


def test_cases_cover_every_local_op():
    missing = set(LOCAL_OPS) - {case[1] for case in CASES}
    assert not missing, f"add a differential case for {sorted(missing)}"


def _input(shape, transposed: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if transposed:  # same shape, column-major strides
        return torch.rand(tuple(reversed(shape)), generator=g).t()
    return torch.rand(tuple(shape), generator=g)


def _lowered(gm: fx.GraphModule, x: torch.Tensor, coord, with_fake_val: bool):
    graph = fx.Graph()
    placeholder = graph.placeholder("x")
    if with_fake_val:
        placeholder.meta["val"] = FakeTensorMode().from_tensor(x)
    ctx = types.SimpleNamespace(coord=coord, device_mesh=None)  # local ops need no group
    out = lower_plan(graph, gm, placeholder, ctx, "existing")
    graph.output(out)
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)(x), out.meta.get("val")


@pytest.mark.parametrize("with_fake_val", [True, False], ids=["fake_val", "no_val"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eager_equals_lowered_graph_at_every_coordinate(case, with_fake_val):
    _, name, in_shape, params, transposed = case
    builder = GraphBuilder(in_shape)
    builder.emit(name, *params)
    out_shape = builder.shape
    gm = builder.finish()
    for seed, coord in enumerate(COORDS):
        x = _input([sym.evaluate(sym.as_expr(s), coord) for s in in_shape], transposed, seed)
        eager = run_local_op(name, x, rank_params(params, coord))
        lowered, val = _lowered(gm, x, coord, with_fake_val)
        want = tuple(sym.evaluate(s, coord) for s in out_shape)
        assert tuple(eager.shape) == want, (coord, tuple(eager.shape), want)
        assert lowered.dtype == eager.dtype and torch.equal(lowered, eager), (coord, lowered, eager)
        if with_fake_val:  # the graph's recorded layout is the one eager produces
            assert (tuple(val.shape), val.stride()) == (want, eager.stride()), coord


def test_eager_ops_with_rank_ints_call_no_sympy():
    """The eager entry point is for per-rank executables: ints in, no sympy on the way."""
    sympy_dir = sympy.__file__.rsplit("/", 1)[0]
    calls = []
    runs = [
        (
            name,
            _input([sym.evaluate(sym.as_expr(s), (1, 2)) for s in shape], t, 0),
            rank_params(params, (1, 2)),
        )
        for _, name, shape, params, t in CASES
    ]

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(sympy_dir):
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        for name, x, params in runs:
            run_local_op(name, x, params)
    finally:
        sys.setprofile(None)
    assert not calls, f"sympy called: {sorted(set(calls))}"


# -- collectives: the layout around each functional collective, the exchange simulated ---------------

# (id, collective, input shape, group size, params after the group)
COLLECTIVE_CASES = [
    ("a2a_dim0_to_1", "all_to_all", (4, 6), 2, (0, 1)),
    ("a2a_dim1_to_2", "all_to_all", (4, 6, 2), 2, (1, 2)),
    ("a2a_dim1_to_0_by3", "all_to_all", (3, 6), 3, (1, 0)),
    ("a2a_two_split_dims", "all_to_all", (4, 6, 2), 4, (((0, 2), (1, 2)), 2)),
    ("a2a_two_split_dims_swapped", "all_to_all", (4, 6, 2), 4, (((1, 2), (0, 2)), 0)),
    ("a2a_empty", "all_to_all", (4, 0), 2, (0, 1)),
    ("gather_dim0", "all_gather", (2, 3), 3, (0,)),
    ("gather_dim1", "all_gather", (2, 3, 2), 2, (1,)),
    ("scatter_dim0", "reduce_scatter", (6, 2), 2, ("sum", 0)),
    ("scatter_dim1", "reduce_scatter", (2, 6, 2), 3, ("sum", 1)),
    # dims of size 1 before the gathered or scattered one: the blocks lie end to end
    ("gather_dim1_after_ones", "all_gather", (1, 3, 2), 2, (1,)),
    ("scatter_dim2_after_ones", "reduce_scatter", (1, 1, 6), 3, ("sum", 2)),
    ("a2a_dim1_to_2_after_ones", "all_to_all", (1, 4, 2), 2, (1, 2)),
]


def _blocks(x, splits):
    blocks = [x]
    for d, pieces in splits:
        blocks = [c for b in blocks for c in torch.chunk(b, pieces, d)]
    return blocks


def _expected(kind, xs, n, params):
    """What each rank holds after the IR collective, from torch.chunk / cat directly."""
    if kind == "all_to_all":
        split, cat = params
        splits = split if isinstance(split, tuple) else ((split, n),)
        return [torch.cat([_blocks(x, splits)[k] for x in xs], cat) for k in range(n)]
    if kind == "all_gather":
        return [torch.cat(xs, params[0])] * n
    return list(torch.chunk(sum(xs), n, params[1]))


def _exchange(kind, sends, n):
    """The functional collective itself on n ranks' buffers."""
    if kind == "all_to_all":  # row k of rank j's buffer reaches rank k at row j
        return [torch.stack([s[k] for s in sends]) for k in range(n)]
    if kind == "all_gather":
        return [torch.cat(sends)] * n
    return list(torch.chunk(sum(sends), n))  # reduce_scatter, sum


def _emitted(fn, x, graph_emitter: bool):
    if fn is None:
        return x
    if not graph_emitter:
        return fn(EAGER, x)
    graph = fx.Graph()
    placeholder = graph.placeholder("x")
    placeholder.meta["val"] = FakeTensorMode().from_tensor(x)
    graph.output(fn(Emitter(graph), placeholder))
    return fx.GraphModule(torch.nn.Module(), graph)(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=["f32", "c64"])
@pytest.mark.parametrize("graph_emitter", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("case", COLLECTIVE_CASES, ids=[c[0] for c in COLLECTIVE_CASES])
def test_collective_layout_around_the_exchange(case, graph_emitter, dtype):
    _, kind, shape, n, params = case
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(shape, generator=g, dtype=dtype) for _ in range(n)]
    c = collective(kind, shape, dtype, n, params)
    sends = [_emitted(c.before, x, graph_emitter) for x in xs]
    if dtype.is_complex and kind != "reduce_scatter":  # only bytes move: as real pairs
        assert all(not s.is_complex() for s in sends)
    got = [_emitted(c.after, y, graph_emitter) for y in _exchange(kind, sends, n)]
    for k, (a, b) in enumerate(zip(got, _expected(kind, xs, n, params))):
        assert a.dtype == dtype and a.shape == b.shape and torch.equal(a, b), (k, a, b)


@pytest.mark.parametrize(
    "kind, shape, params, copies, views",
    [
        ("all_gather", (2, 3, 2), (1,), 1, 2),  # view, permute, clone, view
        ("all_gather", (1, 3, 2), (1,), 0, 1),  # a sequence-parallel activation: one view
        ("reduce_scatter", (2, 6, 2), ("sum", 1), 1, 2),
        ("reduce_scatter", (1, 6, 2), ("sum", 1), 0, 1),
        ("reduce_scatter", (1, 1, 6), ("sum", 2), 0, 1),
        ("all_to_all", (1, 4, 2), (1, 2), 0, 1),
        ("all_to_all", (4, 6), (1, 0), 1, 1),  # view, permute, clone: already [n, *block]
    ],
)
def test_a_layout_copies_only_where_the_blocks_are_not_end_to_end(kind, shape, params, copies, views):
    """The layout around a collective is at most one copy between two views, and a single
    view where the blocks lie end to end: no chain of views (each a node every compiler
    pass after the trace visits), no view to the shape a value already has."""
    c = collective(kind, shape, torch.float32, 2, params)
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = FakeTensorMode().from_tensor(torch.zeros(shape))
    layout = c.after if kind == "all_gather" else c.before
    if kind == "all_gather":
        x.meta["val"] = FakeTensorMode().from_tensor(torch.zeros(2 * shape[0], *shape[1:]))
    graph.output(layout(Emitter(graph), x))
    clones = [n for n in graph.nodes if n.target is torch.ops.aten.clone.default]
    assert len(clones) == copies, graph
    viewing = [n for n in graph.nodes if n.target is torch.ops.aten.view.default]
    assert len(viewing) == views, graph
    assert all(list(n.args[0].meta["val"].shape) != list(n.args[1]) for n in viewing), graph
