"""Differential test harness for ``redist_opt``.

The oracle is torch's own ``DTensor.redistribute`` with its transform-merge
pass disabled (``disable_redistribute_transform_optimization``), executed under
``LocalTensorMode`` on the ``fake`` process-group backend, so that every rank
of a mesh is simulated inside this one process.

``check_case`` builds one input DTensor, runs the oracle and
``redist_opt.redistribute(..., groups="existing")`` on it and asserts that

* both raise, or neither does (redist_opt must then raise RedistributeError or
  RuntimeError with a non-empty message);
* every rank's local result is bitwise equal (``torch.equal``), with the same
  shape and dtype;
* the output DTensor has the same placements, global shape, stride, dtype and
  mesh;
* the number of collectives recorded by ``CommDebugMode`` is equal, and so is
  the number of each kind (all_reduce, all_gather, reduce_scatter, all_to_all:
  see ``collective_kind``);
* the input DTensor's local tensors were not modified by either call.

It also cross-checks the oracle against an independent reference computed in
plain Python (``global_reference``), so that a harness bug (a malformed input,
a mesh the simulation cannot represent) shows up as an ORACLE SANITY failure
rather than silently passing. Where torch fails *inside* the simulation (not a
rejection of the request, see ``is_rejection``), redist_opt is checked against
that reference instead; such cases are listed at the end of the pytest run.

The pieces live beside it: ``meshes`` (the fake process group and the named
meshes), ``inputs`` (placement strings and input DTensors), ``runs`` (one side
run under ``CommDebugMode``) and ``reference`` (the independent reference).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Placement

import redist_opt
from support.inputs import (
    DTYPE_NAMES,
    Input,
    build_input,
    case_seed,
    local_tensors,
    normalize,
    parse_placement,
    pstr,
)
from support.meshes import MESHES, MeshFactory, ensure_fake_pg, get_mesh, mesh_coordinates
from support.reference import oracle_sanity, tolerance
from support.run_report import REPORT
from support.runs import Outcome, run_candidate, run_oracle

# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    mesh: str
    src: tuple[str, ...]
    dst: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    via: str = "function"
    pass_mesh: bool = False
    dst_as_strings: bool = False
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        s = (
            f"{self.mesh}-{','.join(self.src)}_to_{','.join(self.dst)}"
            f"-{'x'.join(map(str, self.shape)) or 'scalar'}-{DTYPE_NAMES[self.dtype]}"
        )
        if self.via != "function":
            s += f"-via_{self.via}"
        if self.pass_mesh:
            s += "-mesh_kw"
        if self.dst_as_strings:
            s += "-str"
        for k, v in self.kwargs:
            s += f"-{k}={DTYPE_NAMES.get(v, v)}"
        return s


def check_case(
    mesh_factory: MeshFactory | str,
    src: Sequence[str | Placement],
    dst: Sequence[str | Placement],
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    *,
    via: str = "function",
    pass_mesh: bool = False,
    dst_as_strings: bool = False,
    redistribute_kwargs: dict[str, Any] | None = None,
    check_counts: bool = True,
    sanity: bool = True,
    seed: int | None = None,
    groups: str = "existing",
    cost=None,
) -> Outcome:
    """Run the oracle and redist_opt on the same input and compare everything.

    ``groups`` and ``cost`` go to the optimized run. Returns the oracle's Outcome
    (for callers that want the counts) with ``.optimized``, the optimized run's."""
    if isinstance(mesh_factory, str):
        mesh_factory = MESHES[mesh_factory]
    ensure_fake_pg()
    kwargs = dict(redistribute_kwargs or {})
    src_p = [parse_placement(p) for p in src]
    dst_p = [parse_placement(p) for p in dst]
    dst_arg = [pstr(p) for p in dst_p] if dst_as_strings else dst_p
    if seed is None:
        seed = case_seed(
            mesh_factory.name, tuple(map(pstr, src_p)), tuple(map(pstr, dst_p)), tuple(shape), str(dtype)
        )
    # Only input construction and the two redistribute calls run inside
    # LocalTensorMode; every check runs outside it (inside, factory functions
    # would create per-rank data).
    with LocalTensorMode(mesh_factory.nranks) as lm:
        mesh = get_mesh(mesh_factory, lm)
        coords = mesh_coordinates(mesh_factory, lm)
        inp = build_input(mesh, lm, src_p, shape, dtype, seed, coords)
        ref = run_oracle(inp, dst_p, **kwargs)
        cand = run_candidate(inp, dst_arg, via=via, pass_mesh=pass_mesh, passes=(), **kwargs)
        opt_kwargs = dict(kwargs, cost=cost) if cost is not None else kwargs
        opt = run_candidate(inp, dst_arg, via=via, pass_mesh=pass_mesh, groups=groups, **opt_kwargs)
    _assert_input_unchanged(inp, "torch (oracle) or redist_opt")
    if ref.error is None and sanity and mesh_factory.global_check:
        oracle_sanity(inp, ref.out, shape, dst_p)

    if ref.error is not None and not is_rejection(ref.error):
        _check_against_reference(mesh_factory, inp, ref, cand, shape, dst_p)
        _check_against_reference(mesh_factory, inp, ref, opt, shape, dst_p, optimized=True)
        return ref
    compare(ref, cand, check_counts=check_counts)
    linear = any(p.is_partial() and p.reduce_op in ("sum", "avg") for p in src_p)
    compare(ref, opt, check_counts=check_counts, optimized=True, linear_reductions=linear)
    ref.optimized = opt
    return ref


# torch's ways of *rejecting* a redistribution (bad or unsupported request).
# When the oracle fails with one of these, redist_opt must reject it too.
_REJECTION_RE = re.compile(
    r"Can not redistribute from|not supported|does not support complex|"
    r"not implemented for complex|greater than tensor ndim|must be normalized|"
    r"Mixed Partial|out of range",
)


def is_rejection(err: BaseException) -> bool:
    return isinstance(err, IndexError) or bool(_REJECTION_RE.search(str(err)))


# Cases where torch failed *inside* the LocalTensorMode simulation (e.g. a
# reduce_scatter whose per-rank local sizes differ across groups: a real run
# evaluates the padding decision per rank, the simulation evaluates it once for
# all ranks and then fails in torch.cat). The oracle is unavailable there; the
# candidate is checked against the independent reference instead; such cases are
# listed at the end of the run (REPORT.oracle_artifacts).


def _check_against_reference(mesh_factory, inp, ref, cand, shape, dst_p, optimized=False) -> None:
    if not optimized:
        REPORT.oracle_artifacts.append(
            f"{mesh_factory.name} {tuple(map(pstr, inp.src))}->"
            f"{tuple(map(pstr, dst_p))} {tuple(shape)}: {ref.describe_error()}"
        )
    same_as_torch = (
        cand.error is not None and type(cand.error) is type(ref.error) and str(cand.error) == str(ref.error)
    )
    if same_as_torch and optimized:
        # a call handed back to torch (here: complex partials reduced by max, which torch
        # 2.15's LocalTensorMode fails with an internal assert) raises torch's own error
        return
    if cand.error is not None and optimized:
        raise AssertionError(
            f"torch fails inside the simulation; the optimized plan raised {cand.describe_error()}\n{cand.tb}"
        )
    if cand.error is not None:
        # the same simulation failure (redist_opt reuses torch's primitives)
        assert type(cand.error) is type(ref.error) and str(cand.error) == str(ref.error), (
            f"torch fails inside the simulation with {ref.describe_error()}; "
            f"redist_opt raised a different error {cand.describe_error()}\n{cand.tb}"
        )
        return
    if not mesh_factory.global_check:
        import pytest

        pytest.skip(
            f"torch fails inside the simulation ({ref.describe_error()}) and "
            f"mesh {mesh_factory.name} has no independent reference"
        )
    dst_n = tuple(normalize(p, len(shape)) for p in dst_p)
    out = cand.out
    assert isinstance(out, DTensor), f"redist_opt returned {type(out).__name__}"
    assert tuple(out.placements) == dst_n, (
        f"placements: redist_opt {tuple(map(pstr, out.placements))} != {tuple(map(pstr, dst_n))}"
    )
    assert tuple(out.shape) == tuple(shape)
    try:
        oracle_sanity(inp, out, shape, dst_p)
    except AssertionError as e:
        raise AssertionError(
            "(torch fails inside the simulation here, so redist_opt is checked "
            "against the independent reference) " + str(e).replace("ORACLE SANITY: ", "")
        ) from None


def _assert_input_unchanged(inp: Input, who: str) -> None:
    for r, before in inp.snapshot.items():
        now = inp.dt._local_tensor._local_tensors[r]
        assert now.shape == before.shape and torch.equal(now, before), (
            f"{who} modified the input DTensor's local tensor on rank {r}"
        )


ACCEPTED_ERRORS = (RuntimeError,)


def compare(
    ref: Outcome,
    cand: Outcome,
    *,
    check_counts: bool = True,
    optimized: bool = False,
    linear_reductions: bool = False,
) -> None:
    """``optimized``: the candidate ran the pass pipeline (see the module docstring)."""
    who = "redist_opt (optimized)" if optimized else "redist_opt"

    if ref.error is not None:
        assert cand.error is not None, (
            f"torch raises {ref.describe_error()} but redist_opt returned a "
            f"DTensor with placements "
            f"{None if cand.out is None else tuple(map(pstr, cand.out.placements))}"
        )
        # torch's own error (a call handed back to torch raises exactly what torch does: under
        # torch 2.15's LocalTensorMode a complex max is a TypeError), or one of ours
        same_as_torch = type(cand.error) is type(ref.error) and str(cand.error) == str(ref.error)
        assert same_as_torch or isinstance(cand.error, (redist_opt.RedistributeError, *ACCEPTED_ERRORS)), (
            f"torch raises {ref.describe_error()}; redist_opt raised "
            f"{cand.describe_error()} which is neither RedistributeError, RuntimeError nor "
            f"torch's own error\n{cand.tb}"
        )
        assert str(cand.error).strip(), f"redist_opt raised {type(cand.error).__name__} with an empty message"
        return

    if cand.error is not None:
        raise AssertionError(f"torch succeeds but redist_opt raised {cand.describe_error()}\n{cand.tb}")
    a, b = ref.out, cand.out
    assert isinstance(b, DTensor), f"redist_opt returned {type(b).__name__}, not DTensor"
    assert tuple(b.placements) == tuple(a.placements), (
        f"placements: redist_opt {tuple(map(pstr, b.placements))} != torch {tuple(map(pstr, a.placements))}"
    )
    assert b.shape == a.shape, f"global shape: redist_opt {tuple(b.shape)} != torch {tuple(a.shape)}"
    assert b.stride() == a.stride(), f"global stride: redist_opt {b.stride()} != torch {a.stride()}"
    assert b.dtype == a.dtype, f"dtype: redist_opt {b.dtype} != torch {a.dtype}"
    assert b.device_mesh == a.device_mesh, f"mesh: redist_opt {b.device_mesh} != torch {a.device_mesh}"
    la = local_tensors(a)
    lb = local_tensors(b)
    assert set(lb) == set(la), f"ranks: redist_opt {sorted(lb)} != torch {sorted(la)}"
    for r in sorted(la):
        x, y = la[r], lb[r]
        assert y.shape == x.shape, (
            f"rank {r}: local shape redist_opt {tuple(y.shape)} != torch {tuple(x.shape)}"
        )
        assert y.dtype == x.dtype, f"rank {r}: local dtype redist_opt {y.dtype} != torch {x.dtype}"
        if not torch.equal(y, x):
            if optimized and linear_reductions:
                rtol, atol = tolerance(x.dtype)
                if torch.allclose(y, x, rtol=rtol, atol=atol):
                    continue
            diff = (
                y.to(torch.complex128 if y.is_complex() else torch.float64)
                - x.to(torch.complex128 if x.is_complex() else torch.float64)
            ).abs()
            raise AssertionError(
                f"rank {r}: {who}: local values differ (max abs diff {diff.max().item():.3g}, "
                f"{int((diff != 0).sum())}/{diff.numel()} elements)"
            )
    if check_counts and optimized:
        assert cand.total <= ref.total, (
            f"collective count: {who} {cand.total} {dict(cand.counts)} > torch "
            f"(merge disabled) {ref.total} {dict(ref.counts)}"
        )
    elif check_counts:
        assert cand.total == ref.total, (
            f"collective count: redist_opt {cand.total} {dict(cand.counts)} != torch "
            f"(merge disabled) {ref.total} {dict(ref.counts)}"
        )
        assert cand.counts == ref.counts, (
            f"collective kinds: redist_opt {dict(cand.counts)} != torch (merge disabled) {dict(ref.counts)}"
        )


def run_case(case: Case, **extra) -> Outcome:
    return check_case(
        case.mesh,
        case.src,
        case.dst,
        case.shape,
        case.dtype,
        via=case.via,
        pass_mesh=case.pass_mesh,
        dst_as_strings=case.dst_as_strings,
        redistribute_kwargs=dict(case.kwargs),
        **extra,
    )


def oracle_only(case: Case) -> Outcome:
    """Run only the oracle (+ sanity) for a case: the harness self-test, and the counts
    of a case whose full comparison test_differential.py makes."""
    f = MESHES[case.mesh]
    ensure_fake_pg()
    src_p = [parse_placement(p) for p in case.src]
    dst_p = [parse_placement(p) for p in case.dst]
    seed = case_seed(
        f.name, tuple(map(pstr, src_p)), tuple(map(pstr, dst_p)), tuple(case.shape), str(case.dtype)
    )
    with LocalTensorMode(f.nranks) as lm:
        mesh = get_mesh(f, lm)
        inp = build_input(mesh, lm, src_p, case.shape, case.dtype, seed, mesh_coordinates(f, lm))
        ref = run_oracle(inp, dst_p, **dict(case.kwargs))
    _assert_input_unchanged(inp, "torch (oracle)")
    if ref.error is None and f.global_check:
        oracle_sanity(inp, ref.out, case.shape, dst_p)
    return ref
