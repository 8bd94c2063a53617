"""Every placement pair of a 2x2 mesh through redist_opt, against torch's own call, under
each of torch's two planners, on whichever torch is installed.

Placements ``R``, ``S(0)``, ``S(1)``, ``P`` per mesh dim (256 pairs), a (6, 5) tensor of
small integers in float32 (sums exact: the comparison is bitwise), under LocalTensorMode on
the fake backend. For each pair, ``DTensor.redistribute`` as torch ships it (merge pass on),
the same call routed through ``redist_opt.enabled()``, and ``redist_opt.redistribute`` must

* all succeed, with the same placements and, on every simulated rank, the same local
  tensor, bit for bit; or
* all raise, redist_opt an instance of the type torch raises.

Under torch's greedy planner (the default) and under ``use_min_cost_redistribution_plan()``.
torch's plan cache (``_gen_transform_infos``) ignores that flag, so it is cleared before
every call: each call plans with the planner it is made under. redist_opt's own caches are
not cleared (its decisions must not depend on which planner answered first).

torch 2.15 accepts ``Shard -> Partial("sum")`` (a local zero-fill, which redist_opt hands
back to torch); torch 2.13 refuses every new Partial: the counts of accepted pairs differ.

The same pairs through torch's ``redistribute_local_tensor`` itself, the function DTensor's
implicit reshards (op dispatch, gradients) call with any target, ``Replicate -> Partial``
included: torch 2.15's graph-based planner may reach a ``Partial("sum")`` target from
Replicate by a chunk and a zero-fill, where its greedy planner (and redist_opt's lowering)
divides by the group size. Same sum, other values on the ranks: redist_opt hands such calls
back, for as long as torch's plan for them is that path.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import warnings

import pytest
import torch
from support.exact_runs import int_input
from support.inputs import parse_placement, pstr
from support.meshes import MESHES, ensure_fake_pg, get_mesh, mesh_coordinates
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import _redistribute as torch_redistribute
from torch.distributed.tensor._dtensor_spec import DTensorSpec

import redist_opt
from redist_opt.torch_api import dtensor as tdt

pytestmark = pytest.mark.differential

PLACEMENTS = ("R", "S(0)", "S(1)", "P")
PAIRS = list(itertools.product(itertools.product(PLACEMENTS, repeat=2), repeat=2))
SHAPE = (6, 5)

# Pairs torch accepts: every pair without a new Partial (169), and on torch 2.15 the 56
# whose new Partials all come from a Shard.
ACCEPTED = 225 if tdt.ZERO_FILLS_SHARD_TO_PARTIAL else 169


def _planner(name: str):
    if name == "min_cost":
        return torch_redistribute.use_min_cost_redistribution_plan()
    return contextlib.nullcontext()


def _call(planner: str, fn, *args):
    """(result, error) of ``fn(*args)`` under ``planner``, torch's plan cache cleared first."""
    torch_redistribute._gen_transform_infos.cache_clear()
    with _planner(planner), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hand-backs warn once per reason
        try:
            return fn(*args), None
        except Exception as e:  # noqa: BLE001 - compared with torch's
            return None, e


def _routed(dt, mesh, dst):
    with redist_opt.enabled():
        return dt.redistribute(mesh, dst)


def _difference(want, got) -> str | None:
    if tuple(got.placements) != tuple(want.placements):
        return f"placements {tuple(map(pstr, got.placements))} != {tuple(map(pstr, want.placements))}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    a, b = want._local_tensor._local_tensors, got._local_tensor._local_tensors
    for r in sorted(a):
        if b[r].shape != a[r].shape or b[r].dtype != a[r].dtype or not torch.equal(b[r], a[r]):
            return f"rank {r}: local {b[r].tolist()} != torch's {a[r].tolist()}"
    return None


@pytest.mark.parametrize("planner", ["greedy", "min_cost"])
def test_every_2x2_pair_matches_torchs_own_call(planner):
    ensure_fake_pg()
    factory = MESHES["2x2"]
    failures, accepted = [], 0
    with LocalTensorMode(factory.nranks) as lm:
        mesh = get_mesh(factory, lm)
        coords = mesh_coordinates(factory, lm)
        for i, (src, dst) in enumerate(PAIRS):
            src_p = [parse_placement(p) for p in src]
            dst_p = [parse_placement(p) for p in dst]
            dt, _ = int_input(mesh, lm, src_p, SHAPE, torch.float32, seed=i, coords=coords)
            want, want_err = _call(planner, dt.redistribute, mesh, dst_p)
            runs = {
                "enabled()": _call(planner, _routed, dt, mesh, dst_p),
                "redist_opt.redistribute": _call(planner, redist_opt.redistribute, dt, dst_p),
            }
            accepted += want_err is None
            for who, (got, err) in runs.items():
                case = f"{','.join(src)} -> {','.join(dst)} via {who}"
                if want_err is not None:
                    if err is None:
                        failures.append(f"{case}: torch raises {want_err!r}, redist_opt returned a DTensor")
                    elif not isinstance(err, type(want_err)):
                        failures.append(f"{case}: torch raises {want_err!r}, redist_opt {err!r}")
                elif err is not None:
                    failures.append(f"{case}: torch succeeds, redist_opt raised {err!r}")
                else:
                    diff = _difference(want, got)
                    if diff is not None:
                        failures.append(f"{case}: {diff}")
    assert not failures, f"{len(failures)} of {2 * len(PAIRS)} calls differ from torch's:\n" + "\n".join(
        failures[:40]
    )
    assert accepted == ACCEPTED, (accepted, ACCEPTED)


@pytest.mark.parametrize("planner", ["greedy", "min_cost"])
def test_every_2x2_local_redistribution_matches_torchs_own_call(planner):
    ensure_fake_pg()
    factory = MESHES["2x2"]
    torch_module = importlib.import_module("torch.distributed.tensor._redistribute")
    failures, accepted = [], 0
    with LocalTensorMode(factory.nranks) as lm:
        mesh = get_mesh(factory, lm)
        coords = mesh_coordinates(factory, lm)
        for i, (src, dst) in enumerate(PAIRS):
            src_p = [parse_placement(p) for p in src]
            dst_p = [parse_placement(p) for p in dst]
            dt, _ = int_input(mesh, lm, src_p, (8, 8), torch.float32, seed=i, coords=coords)
            current = dt._spec
            target = DTensorSpec(mesh, tuple(dst_p), tensor_meta=current.tensor_meta)
            want, want_err = _call(planner, tdt.TORCH_REDISTRIBUTE_LOCAL, dt._local_tensor, current, target)
            with redist_opt.enabled():
                got, err = _call(
                    planner, torch_module.redistribute_local_tensor, dt._local_tensor, current, target
                )
            accepted += want_err is None
            case = f"{','.join(src)} -> {','.join(dst)}"
            if want_err is not None:
                if err is None or not isinstance(err, type(want_err)):
                    failures.append(f"{case}: torch raises {want_err!r}, redist_opt {err!r}")
            elif err is not None:
                failures.append(f"{case}: torch succeeds, redist_opt raised {err!r}")
            else:
                for r in sorted(want._local_tensors):
                    a, b = want._local_tensors[r], got._local_tensors[r]
                    if b.shape != a.shape or not torch.equal(b, a):
                        failures.append(f"{case}: rank {r}: local {b.tolist()} != torch's {a.tolist()}")
                        break
    assert not failures, f"{len(failures)} of {len(PAIRS)} calls differ from torch's:\n" + "\n".join(
        failures[:40]
    )
    assert accepted > ACCEPTED  # Replicate -> Partial is accepted here
