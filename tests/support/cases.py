"""Deterministic generation of the differential cases (see tests/runtime/test_differential.py).

Exhaustive where cheap (every src/dst pair on 1-D and 2-D meshes), stratified
elsewhere. Everything is derived from fixed seeds, so the case list and the ids
are stable from run to run.
"""

from __future__ import annotations

import itertools
import random

import torch

from support.harness import Case

F32, F64, BF16, C64 = torch.float32, torch.float64, torch.bfloat16, torch.complex64

EVEN = (24, 24)  # divisible by every mesh-dim product used here (2,3,4,6,8)
UNEVEN = [(5, 3), (7, 5), (3, 7)]
ZERO = [(0, 4), (4, 0)]
SHAPES_2D = [EVEN, *UNEVEN, *ZERO]

V1 = ["R", "S(0)", "S(1)", "P"]  # 1-D mesh vocabulary
V1_SPELLED = ["R", "S(0)", "S(1)", "S(-1)", "P"]  # with S(-1) spelled: its own section, and samples
V2 = ["R", "S(0)", "S(1)", "P"]  # per-dim vocabulary on N-D meshes
OPS = ["avg", "max", "min"]


def with_op(pl, op):
    return tuple(f"P({op})" if p == "P" else p for p in pl)


def lists(vocab, ndim):
    return [tuple(x) for x in itertools.product(vocab, repeat=ndim)]


def _valid_src(c):
    """The input DTensor must be constructible: src shard dims in range."""
    nd = len(c.shape)
    return all(-nd <= int(p[2:-1]) < nd for p in c.src if p.startswith("S("))


def _dedupe(cases):
    seen, out = set(), []
    for c in cases:
        if _valid_src(c) and c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def one_d_cases():
    cases = []
    meshes = ["1d2", "1d3", "1d4"]
    pairs = [(s, d) for s in lists(V1, 1) for d in lists(V1, 1)]
    # every pair x every shape, float32
    for m in meshes:
        for s, d in pairs:
            for shape in SHAPES_2D:
                cases.append(Case(m, s, d, shape))
    # partial reduce ops: every pair that involves P
    for m in meshes:
        for op in OPS:
            for s, d in pairs:
                if "P" in s or "P" in d:
                    for shape in [(5, 3), EVEN, (0, 4)]:
                        cases.append(Case(m, with_op(s, op), with_op(d, op), shape))
    # other dtypes: every pair on one uneven shape
    for m in meshes:
        for dt in [F64, BF16, C64]:
            for s, d in pairs:
                cases.append(Case(m, s, d, (7, 5), dt))
            for op in OPS:
                cases.append(Case(m, (f"P({op})",), ("R",), (7, 5), dt))
                cases.append(Case(m, (f"P({op})",), ("S(0)",), (7, 5), dt))
    # 1-D and 3-D tensors (S(1) on a 1-D tensor must be rejected by both)
    for m in meshes:
        for s, d in pairs:
            cases.append(Case(m, s, d, (7,)))
        for s, d in itertools.product(lists(["R", "S(0)", "S(2)", "P"], 1), repeat=2):
            cases.append(Case(m, s, d, (3, 4, 5)))
    # S(-1) spelled: negative dims are resolved against the tensor's rank on entry
    # (ir.placements.normalize_placements), before anything that depends on the shape,
    # dtype or reduce op, so every pair that spells one runs once per mesh and tensor
    # rank (S(1), S(0) and S(2) on 2-, 1- and 3-D tensors), not once per shape and dtype
    vocab = V1_SPELLED
    negative = [(s, d) for s in lists(vocab, 1) for d in lists(vocab, 1) if "S(-1)" in s + d]
    for m in meshes:
        for s, d in negative:
            for shape in [(7, 5), (7,), (3, 4, 5)]:
                cases.append(Case(m, s, d, shape))
    return cases


def two_d_cases():
    cases = []
    pairs = [(s, d) for s in lists(V2, 2) for d in lists(V2, 2)]
    # every pair x every shape on 2x2; every pair on 3x2 and 2x4, each on three
    # different shapes (rotating over the pair index, so every shape class
    # sees half of the pairs on each mesh); every pair on 2x3 on one shape
    for s, d in pairs:
        for shape in SHAPES_2D:
            cases.append(Case("2x2", s, d, shape))
    for m in ["3x2", "2x4"]:
        for i, (s, d) in enumerate(pairs):
            for k in (0, 2, 4):
                cases.append(Case(m, s, d, SHAPES_2D[(i + k) % 6]))
    for i, (s, d) in enumerate(pairs):
        cases.append(Case("2x3", s, d, SHAPES_2D[i % 6]))
    rng = random.Random(2024)
    # S(-1) spelled in src/dst
    for m in ["2x2", "3x2"]:
        for s, d in rng.sample(pairs, 40):
            s2 = tuple("S(-1)" if p == "S(1)" else p for p in s)
            d2 = tuple("S(-1)" if p == "S(1)" else p for p in d)
            cases.append(Case(m, s2, d2, rng.choice(UNEVEN)))
    # partial reduce ops
    p_pairs = [(s, d) for s, d in pairs if "P" in s or "P" in d]
    for op in OPS:
        # every pair involving P on 2x2, a sample on 3x2 / 2x4
        for i, (s, d) in enumerate(p_pairs):
            cases.append(Case("2x2", with_op(s, op), with_op(d, op), SHAPES_2D[i % 6]))
        for m, k in [("3x2", 25), ("2x4", 25)]:
            for s, d in rng.sample(p_pairs, k):
                cases.append(Case(m, with_op(s, op), with_op(d, op), rng.choice(SHAPES_2D)))
    # dtypes
    for dt in [F64, BF16, C64]:
        for m in ["2x2", "3x2", "2x4"]:
            for s, d in rng.sample(pairs, 30):
                cases.append(Case(m, s, d, rng.choice(SHAPES_2D), dt))
            for op in OPS:
                for s, d in rng.sample(p_pairs, 4):
                    cases.append(Case(m, with_op(s, op), with_op(d, op), rng.choice(UNEVEN), dt))
    # 3-D tensors with S(2)
    v3 = ["R", "S(0)", "S(2)", "P"]
    pairs3 = [(s, d) for s in lists(v3, 2) for d in lists(v3, 2)]
    for m in ["2x2", "2x4"]:
        for s, d in rng.sample(pairs3, 40):
            cases.append(Case(m, s, d, rng.choice([(4, 3, 5), (2, 6, 8), (5, 0, 3)])))
    # leading dims of size 1 (a sequence-parallel [1, s, h] activation): the block layouts
    # around gathers and scatters are views there, not copies (local_ops.rearranged)
    for s, d in pairs:
        for shape in [(1, 24), (1, 7)]:
            cases.append(Case("2x2", s, d, shape))
    for s, d in rng.sample(pairs3, 40):
        cases.append(Case("2x4", s, d, rng.choice([(1, 8, 4), (1, 5, 3)])))
    return cases


def three_d_cases():
    cases = []
    rng = random.Random(777)
    all3 = lists(V2, 3)
    # stratified: every src list with 16 random dst lists (and every dst list
    # with 2 random src lists)
    for s in all3:
        for d in rng.sample(all3, 16):
            cases.append(Case("2x2x2", s, d, rng.choice(SHAPES_2D)))
    for d in all3:
        for s in rng.sample(all3, 2):
            cases.append(Case("2x2x2", s, d, rng.choice(SHAPES_2D), rng.choice([F32, F64, BF16])))
    p3 = [(s, d) for s in all3 for d in all3 if "P" in s or "P" in d]
    for op in OPS:
        for s, d in rng.sample(p3, 25):
            cases.append(Case("2x2x2", with_op(s, op), with_op(d, op), rng.choice(SHAPES_2D)))
    for s, d in rng.sample([(s, d) for s in all3 for d in all3], 20):
        cases.append(Case("2x2x2", s, d, rng.choice(UNEVEN), C64))
    return cases


def mesh_variant_cases():
    """Size-1 dims, explicit/permuted rank tensors, submeshes, _unflatten, flatten."""
    cases = []
    rng = random.Random(99)
    variants = {
        "1x4": 2,
        "2x1x2": 3,
        "4x1": 2,
        "explicit2x2": 2,
        "explicit3x2": 2,
        "colmajor2x4": 2,
        "colmajor2x2x2": 3,
        "reversed2x2": 2,
        "reversed1d4": 1,
        "sub_ac_of_2x2x2": 2,
        "sub_b_of_2x2x2": 1,
        "sub_bc_of_2x2x2": 2,
        "sub_tp_of_2x4": 1,
        "unflat4_2x2": 2,
        "unflat8_2x2x2": 3,
        "unflat8_4x2": 2,
        "flat_ac_of_2x2x2": 1,
    }
    for m, nd in variants.items():
        vocab = V1_SPELLED if nd == 1 else V2  # a sample, not a product: S(-1) stays in the draw
        all_l = lists(vocab, nd)
        pairs = [(s, d) for s in all_l for d in all_l]
        k = min(len(pairs), 60)
        for s, d in rng.sample(pairs, k):
            cases.append(Case(m, s, d, rng.choice(SHAPES_2D), rng.choice([F32, F32, F64, BF16])))
        p_pairs = [(s, d) for s, d in pairs if "P" in s or "P" in d]
        for op in OPS:
            for s, d in rng.sample(p_pairs, min(4, len(p_pairs))):
                cases.append(Case(m, with_op(s, op), with_op(d, op), rng.choice(UNEVEN)))
    return cases


def api_variant_cases():
    """redistribute() keyword variants and the redist_opt.enabled() route."""
    cases = []
    rng = random.Random(5)
    pool = [
        (m, s, d)
        for m, nd in [("1d4", 1), ("2x2", 2), ("3x2", 2), ("2x2x2", 3)]
        for s in lists(V2, nd)
        for d in lists(V2, nd)
    ]
    for m, s, d in rng.sample(pool, 60):
        cases.append(Case(m, s, d, rng.choice(SHAPES_2D), via="enabled"))
    for m, s, d in rng.sample(pool, 40):
        cases.append(Case(m, s, d, rng.choice(SHAPES_2D), pass_mesh=True))
    for m, s, d in rng.sample(pool, 40):
        cases.append(Case(m, s, d, rng.choice(SHAPES_2D), dst_as_strings=True))
    for m, s, d in rng.sample(pool, 25):
        cases.append(Case(m, s, d, rng.choice(UNEVEN), F32, kwargs=(("forward_dtype", F64),)))
    for m, s, d in rng.sample(pool, 15):
        cases.append(Case(m, s, d, rng.choice(UNEVEN), F32, kwargs=(("forward_dtype", BF16),)))
    for m, s, d in rng.sample(pool, 15):
        cases.append(Case(m, s, d, rng.choice(UNEVEN), F32, kwargs=(("async_op", True),)))
    return cases


def _mix(src, dst, rng):
    """Give every P of ``src`` sum or avg (both present when there are 2+ Ps); a
    P kept in ``dst`` keeps its op, and a new P in ``dst`` is a sum."""
    ps = [i for i, p in enumerate(src) if p == "P"]
    ops = [rng.choice(["sum", "avg"]) for _ in ps]
    if len(ps) >= 2 and len(set(ops)) == 1:
        ops[rng.randrange(len(ops))] = "avg" if ops[0] == "sum" else "sum"
    op_of = dict(zip(ps, ops))
    s2 = tuple(f"P({op_of[i]})" if i in op_of else p for i, p in enumerate(src))
    d2 = tuple(s2[i] if p == "P" and i in op_of else p for i, p in enumerate(dst))
    return s2, d2


def mixed_partial_cases():
    """Sum and avg partials mixed in one placement (torch accepts them). On 2x2, 2x2x2 and the
    _unflatten view the world / root group exists,
    so the optimized plan merges them into one sum plus a scale."""
    cases = []
    rng = random.Random(1010)
    for m, nd, k in [
        ("2x2", 2, 16),
        ("2x2_ab", 2, 40),
        ("3x2_ab", 2, 24),
        ("2x4", 2, 16),
        ("2x2x2", 3, 32),
        ("2x2x2_ab_ac_bc_abc", 3, 80),
        ("unflat8_2x2x2", 3, 24),
        ("sub_ac_of_2x2x2", 2, 16),
    ]:
        pairs = [(s, d) for s in lists(V2, nd) for d in lists(V2, nd) if s.count("P") >= 2]
        for s, d in rng.sample(pairs, min(k, len(pairs))):
            s2, d2 = _mix(s, d, rng)
            cases.append(Case(m, s2, d2, rng.choice(SHAPES_2D), rng.choice([F32, F32, F64, BF16, C64])))
    # integer dtypes: every avg reduction truncates, so nothing with avg merges or moves
    for m, nd, k in [("2x2_ab", 2, 16), ("2x2x2_ab_ac_bc_abc", 3, 40)]:
        pairs = [(s, d) for s in lists(V2, nd) for d in lists(V2, nd) if s.count("P") >= 2]
        for s, d in rng.sample(pairs, min(k, len(pairs))):
            s2, d2 = _mix(s, d, rng)
            cases.append(Case(m, s2, d2, rng.choice(SHAPES_2D), rng.choice([torch.int64, torch.int32])))
        for s, d in rng.sample(pairs, min(k // 2, len(pairs))):
            cases.append(Case(m, with_op(s, "avg"), with_op(d, "avg"), rng.choice(SHAPES_2D), torch.int64))
    return cases


SHAPES_3D = [(8, 6, 4), (5, 3, 2), (8, 0, 4), (4, 7, 3), (8, 8, 4), (16, 4, 2)]


def chain_cases():
    """Chains on roots with flattened meshes (groups="existing"):
    all_reduce + chunk -> reduce_scatter (P on outer dims, shards on inner ones)
    and nested all_gather + all_to_all chains (S on every dim, dst moves dims)."""
    cases = []
    rng = random.Random(1011)
    # the two canonical chains, even, uneven and zero-size
    for shape in [(8, 6, 4), (8, 8, 4), (5, 3, 2), (8, 0, 4)]:
        cases.append(
            Case("2x2x2x2_ab_cd_abcd", ("P", "P", "S(0)", "S(0)"), ("S(1)", "S(1)", "S(0)", "S(0)"), shape)
        )
    for shape in [(8, 16, 2), (8, 16, 4), (5, 7, 3), (8, 0, 2), (3, 16, 2)]:
        cases.append(Case("2x2x2x2_bcd_cd", ("S(1)",) * 4, ("S(1)", "S(0)", "S(0)", "S(0)"), shape))
    outer = [("P", "P"), ("P", "R"), ("P", "S(1)"), ("R", "P"), ("S(1)", "P")]
    inner = lists(["R", "S(0)", "S(1)"], 2)
    dsts = lists(["R", "S(0)", "S(1)", "S(2)"], 4)
    for m in ["2x2x2x2_ab_cd_abcd", "2x2x2x2_bcd_cd"]:
        for _ in range(24):
            s = rng.choice(outer) + rng.choice(inner)
            cases.append(Case(m, s, rng.choice(dsts), rng.choice(SHAPES_3D), rng.choice([F32, F64, BF16])))
    shards = lists(["S(0)", "S(1)", "S(2)"], 4)
    for m in ["2x2x2x2_bcd_cd", "2x2x2x2_ab_cd_abcd"]:
        for _ in range(24):
            cases.append(
                Case(
                    m,
                    rng.choice(shards),
                    rng.choice(shards),
                    rng.choice(SHAPES_3D),
                    rng.choice([F32, F64, C64]),
                )
            )
    # adjacent all_to_alls that cat one tensor dim (merge-adjacent-all-to-alls)
    srcs = {
        "2x2_ab": [("S(0)", "S(0)"), ("S(1)", "S(1)"), ("S(2)", "S(2)")],
        "3x2_ab": [("S(0)", "S(0)"), ("S(2)", "S(2)")],
        "2x2x2_ab_ac_bc_abc": [("R", "S(0)", "S(0)"), ("S(0)", "S(0)", "S(0)"), ("S(1)", "S(0)", "S(0)")],
    }
    for m, ss in srcs.items():
        nd = len(ss[0])
        for _ in range(24):
            d = tuple(rng.choice(["R", "S(0)", "S(1)", "S(2)"]) for _ in range(nd))
            cases.append(Case(m, rng.choice(ss), d, rng.choice(SHAPES_3D), rng.choice([F32, F64, C64])))
    v3 = ["R", "S(0)", "S(1)", "P"]
    for _ in range(40):
        s = tuple(rng.choice(v3) for _ in range(3))
        d = tuple(rng.choice(v3[:3]) for _ in range(3))
        cases.append(Case("2x2x2_ab_ac_bc_abc", s, d, rng.choice(SHAPES_2D + SHAPES_3D[:3])))
    return cases


# The dtypes torch's redistribute accepts beyond the float ones above: every collective kind
# (all_to_all, all_gather, reduce_scatter, all_reduce; merged on 2x2x2), even and uneven, with
# reduce ops (complex max: c10d's all_reduce refuses it, so torch's planner runs it), directly
# and through enabled().
DTYPE_PROGRAMS = [
    ("2x2", ("S(0)", "R"), ("S(1)", "R"), (8, 4)),
    ("2x2", ("S(0)", "R"), ("S(1)", "R"), (5, 3)),
    ("2x2", ("P", "P"), ("S(0)", "S(1)"), (5, 3)),
    ("2x2", ("S(0)", "S(1)"), ("R", "R"), (7, 5)),
    ("2x2x2", ("S(0)", "S(0)", "S(0)"), ("S(1)", "S(1)", "S(1)"), (8, 8)),
    ("2x2x2", ("P", "P", "P"), ("R", "S(0)", "R"), (5, 3)),
    ("2x2x2_ab_ac_bc_abc", ("S(0)", "S(1)", "S(0)"), ("R", "R", "R"), (5, 3)),
]
DTYPE_OPS = {C64: ("sum", "avg", "max"), BF16: ("sum", "max"), torch.float16: ("avg", "min")}
DTYPE_OPS.update({torch.int64: ("sum", "avg", "max"), torch.bool: ("sum", "min")})


def dtype_cases():
    cases = []
    for dtype, ops in DTYPE_OPS.items():
        for k, (m, s, d, shape) in enumerate(DTYPE_PROGRAMS):
            for op in ops if "P" in s else ("sum",):
                via = "enabled" if k % 2 else "function"
                cases.append(Case(m, with_op(s, op), with_op(d, op), shape, dtype, via=via))
    return cases


def all_cases():
    groups = {
        "1d": one_d_cases(),
        "2d": two_d_cases(),
        "3d": three_d_cases(),
        "mesh_variants": mesh_variant_cases(),
        "api": api_variant_cases(),
        "mixed_partials": mixed_partial_cases(),
        "chains": chain_cases(),
        "dtypes": dtype_cases(),
    }
    return {k: _dedupe(v) for k, v in groups.items()}
