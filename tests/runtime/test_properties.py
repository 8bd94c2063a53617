"""Property-based tests (hypothesis) of the optimizer.

1. ``test_outputs_equal_oracle`` (execution, LocalTensorMode on the fake
   backend): random meshes (1-4 dims, sizes 1-5, at most ``MAX_EXEC_RANKS``
   ranks: the fake world's size), random available flattened groups (any
   subsets of the ascending mesh-dim sets), random placements (R, S(d) with
   negative d, P with one reduce op of sum/avg/max/min or sum and avg mixed), random small shapes
   (uneven and zero-size), float64/float32 small-integer data, groups policy
   existing/create. ``redist_opt.redistribute`` must equal the oracle (torch,
   merge pass disabled) on every rank: bitwise, except avg reductions (another
   summation order: ``assert_close`` with tight tolerances); replicated outputs
   must be bitwise equal across each replica group; the runtime issues exactly
   the collectives the optimized plan lists, never more than the oracle.

2. ``test_plan_never_worse_than_torch`` (planning only, rank-free ``MeshSpec``,
   up to 625 ranks): under the default cost profile the optimized plan never
   issues more collectives nor more bytes per rank than torch 2.13 with its
   merge pass (``support.torch_merge_model.torch_model``) given the same flattened
   groups; where merge-reductions-into-all-reduce chose one fat all_reduce
   (bytes traded for launches) "more bytes" becomes "more modelled time under
   the cost model in use"; under ``groups="existing"`` it needs only groups
   that exist.

Example counts are fixed per test (``N_EXEC``, ``N_PLAN``; 6,000 in total, at
least 2,000 required; the environment variables REDIST_OPT_N_EXEC and
REDIST_OPT_N_PLAN override them); the ``ci`` hypothesis profile registered
below makes them deterministic. On the other torch releases of the range .ci/run
runs the ``range`` profile: 500 and 1,000 examples, drawn from a seed per
release (``--hypothesis-seed``). Both properties are ``slow``; the quick tier
runs ``*_sample`` twins with a twentieth of the examples, drawn from another
seed. The number of examples each property ran is written to the terminal at
the end of the run ("hypothesis examples run: ..."). Minimal failing cases the
properties found are kept as regression tests (``SHRUNK_PLAN``, ``SHRUNK_EXEC``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st
from support import meshes
from support.exact_runs import (
    MeshPool,
    assert_matches_reference,
    assert_replicas_equal,
    assert_same_locals,
    int_input,
    run_oracle,
    run_ours,
)
from support.harness import is_rejection
from support.inputs import pstr
from support.run_report import REPORT
from support.torch_merge_model import signature, torch_model
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import Partial, Replicate, Shard

import redist_opt
import redist_opt.ir.cost
import redist_opt.runtime.mesh_facts

# random programs against torch; .ci/run runs it on every torch of the range
pytestmark = pytest.mark.differential

# Hypothesis profiles. "ci" (the default here, and what .ci/run asks for with
# HYPOTHESIS_PROFILE=ci): deterministic (derandomize), no deadline (a mesh built
# on first use takes longer than hypothesis' default 200 ms), no example
# database, failing examples printed as reproducible blobs. "explore": the same
# with random generation, to look for new failures (HYPOTHESIS_PROFILE=explore).
_COMMON = {
    "deadline": None,
    "print_blob": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("explore", derandomize=False, **_COMMON)
# "range": what .ci/run runs on each torch of the range other than 2.13.0 (with fewer examples,
# REDIST_OPT_N_EXEC and REDIST_OPT_N_PLAN): random generation from the seed pytest is given
# (--hypothesis-seed, one per release), so each release draws other examples than the "ci" ones
# 2.13.0 runs, and a failure reproduces with the release's seed.
settings.register_profile("range", derandomize=False, **_COMMON)
_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(_profile if _profile in ("ci", "explore", "range") else "ci")

N_EXEC = int(os.environ.get("REDIST_OPT_N_EXEC", "1000"))
N_PLAN = int(os.environ.get("REDIST_OPT_N_PLAN", "5000"))
# LocalTensorMode needs a fake world at least as large as the mesh; the session
# fixture (conftest.py) initialises it with meshes.WORLD_SIZE ranks.
MAX_EXEC_RANKS = min(24, meshes.WORLD_SIZE)
MAX_PLAN_RANKS = 5**4
# "sum|avg": every Partial draws sum or avg (torch accepts that mix).
OPS = ("sum", "avg", "max", "min", "sum|avg")
SIZES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 12])  # uneven and zero-size included


_RUNNING = contextvars.ContextVar("property", default="test_shrunk_plan_cases")


@contextlib.contextmanager
def _counted(name: str):
    """Counts the examples a property ran (shrinking replays included) and their
    time, for the end-of-run summary."""
    REPORT.examples[name] += 1
    token = _RUNNING.set(name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        REPORT.seconds[name] += time.perf_counter() - t0
        _RUNNING.reset(token)


# ----------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------


_INT: dict[tuple[int, int], st.SearchStrategy] = {}
BOOL = st.booleans()


def ints(lo: int, hi: int) -> st.SearchStrategy:
    """Cached integer strategies (building strategies per draw is slow)."""
    if (lo, hi) not in _INT:
        _INT[lo, hi] = st.integers(lo, hi)
    return _INT[lo, hi]


def _shard_or(draw, options: str, tnd: int, op: str):
    """One of ``options`` ("R", "S", "P"): Replicate, Shard(d) with d in [-tnd, tnd), Partial(op)."""
    kind = options[draw(ints(0, len(options) - 1))]
    if kind == "R":
        return Replicate()
    if kind == "S":
        return Shard(draw(ints(-tnd, tnd - 1)))
    if op == "sum|avg":
        return Partial(("sum", "avg")[draw(ints(0, 1))])
    return Partial(op)


@st.composite
def requests(draw, max_ranks: int, planning: bool):
    ndim = draw(ints(1, 4))
    sizes, prod = [], 1
    for _ in range(ndim):
        s = draw(ints(1, max(1, min(5, max_ranks // prod))))
        sizes.append(s)
        prod *= s
    sizes = tuple(sizes)
    candidates = [c for k in range(2, ndim + 1) for c in itertools.combinations(range(ndim), k)]
    flattened = tuple(c for c in candidates if draw(BOOL))
    tnd = draw(ints(1, 3))
    shape = tuple(draw(SIZES) for _ in range(tnd))
    op = OPS[draw(ints(0, len(OPS) - 1))]
    src = tuple(_shard_or(draw, "RSP", tnd, op) for _ in range(ndim))
    dst = []
    for s in src:
        # P -> P (kept as is); R -> P only in plans (redistribute rejects it, as torch does)
        keep_p = s.is_partial() or (planning and s.is_replicate())
        d = _shard_or(draw, "RSP" if keep_p else "RS", tnd, op)
        dst.append(s if s.is_partial() and d.is_partial() else d)  # P -> P keeps its op
    policy = ("existing", "create")[draw(ints(0, 1))]
    return {
        "sizes": sizes,
        "flattened": flattened,
        "src": src,
        "dst": tuple(dst),
        "shape": shape,
        "policy": policy,
        "op": op,
    }


def _describe(req) -> str:
    names = MeshPool.names(len(req["sizes"]))
    flat = ["+".join(names[d] for d in g) for g in req["flattened"]]
    return (
        f"mesh {'x'.join(map(str, req['sizes']))} flattened {flat or 'none'} "
        f"{','.join(map(pstr, req['src']))} -> {','.join(map(pstr, req['dst']))} "
        f"shape {req['shape']} groups={req['policy']}"
    )


# ----------------------------------------------------------------------------
# 1. Execution: outputs equal the oracle on every rank
# ----------------------------------------------------------------------------

POOL = MeshPool()


def _clear_spec_cache() -> None:
    # MeshPool.use swaps a root's flattened meshes in place (torch itself only
    # ever adds them); drop redist_opt's per-mesh MeshSpec cache so it re-reads them.
    redist_opt.runtime.mesh_facts._facts_cache.clear()


@settings(max_examples=N_EXEC)
@given(
    req=requests(MAX_EXEC_RANKS, planning=False),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_outputs_equal_oracle(req, dtype, seed):
    with _counted("test_outputs_equal_oracle"):
        check_execution(req, dtype, seed)


# Marked here, not by a decorator: the "ci" profile derives the examples from the
# test's source, and these are the examples the suite has always run.
test_outputs_equal_oracle = pytest.mark.slow(test_outputs_equal_oracle)


@settings(max_examples=max(1, N_EXEC // 20))
@fixed_seed(1310)
@given(
    req=requests(MAX_EXEC_RANKS, planning=False),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_outputs_equal_oracle_sample(req, dtype, seed):
    """The quick tier's sample of the property: other examples than the full one's."""
    with _counted("test_outputs_equal_oracle_sample"):
        check_execution(req, dtype, seed)


# The other dtypes torch's redistribute accepts: complex, half precision, integers and bool (no
# avg: torch's avg cannot cast its quotient back to bool).
OTHER_DTYPES = (torch.complex64, torch.float16, torch.bfloat16, torch.int64, torch.bool)


@settings(max_examples=max(1, N_EXEC // 10))
@fixed_seed(2026)
@given(
    req=requests(MAX_EXEC_RANKS, planning=False),
    dtype=st.sampled_from(OTHER_DTYPES),
    seed=st.integers(0, 2**16),
)
def test_outputs_equal_oracle_other_dtypes(req, dtype, seed):
    ops = {p.reduce_op for p in req["src"] if p.is_partial()}
    assume(not (dtype == torch.bool and "avg" in ops))
    assume(not (dtype.is_complex and ops - {"sum", "avg"}))  # handed to torch (ir.lower.dtype_reason)
    with _counted("test_outputs_equal_oracle_other_dtypes"):
        check_execution(req, dtype, seed)


def _has_reference(dtype, src) -> bool:
    """Whether the independent reference models the result: an integer avg truncates at
    every reduction, so its result depends on the order of the reductions."""
    integral = not (dtype.is_floating_point or dtype.is_complex)
    return not (integral and any(p.is_partial() and p.reduce_op == "avg" for p in src))


def check_execution(req, dtype, seed) -> None:
    sizes, src, dst, shape, policy = req["sizes"], req["src"], req["dst"], req["shape"], req["policy"]
    n = math.prod(sizes)
    assert dist.get_world_size() >= n
    with LocalTensorMode(n) as lm, POOL.use(sizes, req["flattened"], lm) as mesh:
        _clear_spec_cache()
        dt, coords = int_input(mesh, lm, src, shape, dtype, seed, POOL.coords[sizes])
        opt = redist_opt.optimize(
            redist_opt.plan(mesh, list(src), list(dst), shape=shape, dtype=dtype), groups=policy
        )
        oracle = run_oracle(dt, dst)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = run_ours(dt, dst, groups=policy)
        _clear_spec_cache()
    what = _describe(req) + f" {dtype}"
    if oracle.error is not None:
        if is_rejection(oracle.error):
            assert ours.error is not None, (
                f"{what}: torch rejects ({oracle.describe_error()}), redist_opt does not"
            )
            return
        # torch fails inside the LocalTensorMode simulation: check against the
        # independent reference instead
        assert ours.error is None, f"{what}: redist_opt raised {ours.describe_error()}"
        exact = not any(p.is_partial() and p.reduce_op == "avg" for p in src)
        if _has_reference(dtype, src):
            assert_matches_reference(ours.out, dt, coords, shape, src, exact)
            REPORT.reference_checked.append(what)
    else:
        assert ours.error is None, f"{what}: redist_opt raised {ours.describe_error()}; plan {signature(opt)}"
        exact = not any(p.is_partial() and p.reduce_op == "avg" for p in src)
        try:
            assert_same_locals(ours.out, oracle.out, exact=exact)
        except AssertionError as e:
            raise AssertionError(f"{what}: plan {signature(opt)}: {e}") from None
        if not any(p.is_partial() for p in dst) and _has_reference(dtype, src):
            # harness sanity: the oracle itself against the independent reference
            assert_matches_reference(oracle.out, dt, coords, shape, src, exact)
    assert_replicas_equal(ours.out, coords, sizes)
    ours_warnings = [str(w.message) for w in caught if "redist_opt" in str(w.message)]
    assert ours.total == opt.num_collectives, (
        f"{what}: the runtime issued {ours.total} {ours.kinds}, the plan lists "
        f"{signature(opt)}; warnings: {ours_warnings}"
    )
    if oracle.error is None:
        assert ours.total <= oracle.total, (
            f"{what}: redist_opt issued {ours.total} {ours.kinds} > torch (merge off) {oracle.total}"
        )


# ----------------------------------------------------------------------------
# 2. Planning only: never more collectives nor bytes than torch 2.13
# ----------------------------------------------------------------------------


@settings(max_examples=N_PLAN)
@given(
    req=requests(MAX_PLAN_RANKS, planning=True),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
)
def test_plan_never_worse_than_torch(req, dtype):
    with _counted("test_plan_never_worse_than_torch"):
        check_plan(req, dtype)


test_plan_never_worse_than_torch = pytest.mark.slow(test_plan_never_worse_than_torch)  # as above


@settings(max_examples=max(1, N_PLAN // 20))
@fixed_seed(1311)
@given(
    req=requests(MAX_PLAN_RANKS, planning=True),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
)
def test_plan_never_worse_than_torch_sample(req, dtype):
    """The quick tier's sample of the property: other examples than the full one's."""
    with _counted("test_plan_never_worse_than_torch_sample"):
        check_plan(req, dtype)


# The pass that may trade bytes for launches.
LATENCY_TRADE = "merge-reductions-into-all-reduce"


def check_plan(req, dtype) -> None:
    names = MeshPool.names(len(req["sizes"]))
    spec = redist_opt.MeshSpec(req["sizes"], names, flattened=list(req["flattened"]))
    p = redist_opt.plan(spec, list(req["src"]), list(req["dst"]), shape=req["shape"], dtype=dtype)
    assert not p.fallback, p.fallback_reason
    ours = redist_opt.optimize(p, groups=req["policy"])
    model = torch_model(p)
    what = (
        f"{_describe(req)} {dtype}: ours {signature(ours)} ({ours.bytes_per_rank} B), "
        f"torch 2.13 {model.describe()} ({[v.bytes_per_rank for v in model.variants]} B), "
        f"naive {signature(p)}"
    )
    assert ours.num_collectives <= model.min_collectives, f"more collectives than torch: {what}"
    if LATENCY_TRADE in ours.applied_passes:
        # One all_reduce in place of reduce_scatters + all_reduces trades bytes for
        # launches: there the bound is modelled time under the cost model in use.
        REPORT.traded[_RUNNING.get()] += 1
        cost, _ = redist_opt.ir.cost.resolve(spec)
        ours_t, torch_t = cost.plan_time(ours), min(cost.plan_time(v) for v in model.variants)
        assert ours_t <= torch_t * (1 + 1e-9), (
            f"more modelled time than torch under {cost.name}: "
            f"{ours_t * 1e6:.2f}us > {torch_t * 1e6:.2f}us: {what}"
        )
    else:
        assert ours.bytes_per_rank <= model.min_bytes_per_rank, f"more bytes per rank than torch: {what}"
    if req["policy"] == "existing":
        missing = [g for g in ours.groups_needed() if not spec.group_exists(g)]
        assert not missing, f"groups='existing' plan needs groups that do not exist {missing}: {what}"


# ----------------------------------------------------------------------------
# Shrunk failing cases the properties found (kept as regression tests)
# ----------------------------------------------------------------------------


def _req(sizes, flattened, src, dst, shape, policy="existing"):
    names = MeshPool.names(len(sizes))
    parse = redist_opt.parse_placements
    return {
        "sizes": tuple(sizes),
        "flattened": tuple(tuple(names.index(x) for x in g.split("+")) for g in flattened),
        "src": parse(src),
        "dst": parse(dst),
        "shape": tuple(shape),
        "policy": policy,
        "op": "sum",
    }


SHRUNK_PLAN = {
    # reorder-collectives moves chunk(c) between all_gather(c) and all_gather(b), so
    # merge-all-gathers no longer sees them adjacent: 2 all_gathers, torch 1 over b+c
    "chunk_between_gathers_blocks_merge": _req((2, 2, 2), ["b+c"], "R,S(1),S(1)", "S(0),R,S(0)", (8, 8)),
    # the same for reductions: all_reduce(c), chunk(c), all_reduce(b): 4 collectives,
    # torch 3 (all_gather(d), all_reduce(b+c), reduce_scatter(a))
    "chunk_between_reductions_blocks_merge": _req(
        (2, 2, 2, 2), ["b+c"], "P,P,P,S(1)", "S(0),R,S(0),R", (8, 4)
    ),
    # merged uneven reduce_scatter pads 1 element to 6: 24 B; torch's two: 8 + 12 B
    "merged_uneven_reduce_scatter_pads_more": _req((2, 3), ["a+b"], "P,P", "S(0),S(0)", (1,)),
    # all_reduce(a) moved before all_to_all(b), which would have shrunk the local
    # tensor (uneven dim 0 padded to the chunk): 128 B, torch 112 B
    "all_reduce_moved_before_shrinking_all_to_all": _req((2, 2), [], "P,S(0)", "R,S(1)", (3, 8)),
    # all_reduce(a) moved before all_gather(c) + chunk(b), which end smaller: 16 B, torch 12 B
    "all_reduce_moved_before_gather_and_chunk": _req((2, 3, 2), [], "P,R,S(0)", "R,S(0),R", (3,)),
}


@pytest.mark.parametrize("name", list(SHRUNK_PLAN))
def test_shrunk_plan_cases(name):
    check_plan(SHRUNK_PLAN[name], torch.float32)


SHRUNK_EXEC = {
    # runtime.rank_coordinates: a size-1 mesh dim's coordinate is a SymInt over a
    # ConstantIntNode under LocalTensorMode; int() on it raises AttributeError
    "size1_mesh_dim_coordinates": _req((1, 2), [], "R,R", "R,S(0)", (3,)),
    # merge-reductions-into-all-reduce dropped the division of a sum merge-reductions had made
    # of sum and avg (the "range" profile's seed for torch 2.11 found it; every release had it)
    "mixed_sum_avg_into_one_all_reduce": _req((4, 2, 2), ["a+b"], "P,P(avg),P", "R,R,S(0)", (1,)),
}


@pytest.mark.parametrize("name", list(SHRUNK_EXEC))
def test_shrunk_exec_cases(name):
    check_execution(SHRUNK_EXEC[name], torch.float64, 0)
