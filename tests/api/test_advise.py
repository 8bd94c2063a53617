"""The search behind ``Recording.advise`` on rank-free recordings: k=0 is the existing
groups' time, exact and greedy search agree on small cases, the advised time is the
re-planned time, group creation is priced, existing groups are no candidates."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import redist_opt
from redist_opt.api import advice
from redist_opt.api.advice import Candidate, advise, candidates, greedy, mesh_record_of_spec, search
from redist_opt.ir.cost import CostModel

MODEL = CostModel.default()


def _entries(*rows):
    """(src, dst, shape, count) rows on mesh 0, one call site each."""
    return [
        {
            "mesh": 0,
            "src": src,
            "dst": dst,
            "shape": list(shape),
            "dtype": "float32",
            "site": {"label": f"site{i}"},
            "count": count,
            "ranks": [0],
            "torch_only": None,
        }
        for i, (src, dst, shape, count) in enumerate(rows)
    ]


def _replanned_time(spec, entries, model=MODEL):
    total = 0.0
    for e in entries:
        p = redist_opt.plan(spec, e["src"], e["dst"], shape=e["shape"], dtype=torch.float32)
        total += e["count"] * model.plan_time(redist_opt.optimize(p, groups="existing", cost=model))
    return total


SPEC3 = redist_opt.MeshSpec(sizes=(2, 2, 2), names=("dp", "cp", "tp"))
STEP3 = _entries(
    ("P,P,S(1)", "R,R,S(1)", (64, 64), 2),  # gradients: dp+cp
    ("P,P,P", "R,R,R", (), 1),  # the loss: all three
    ("S(0),S(0),P", "S(0),S(0),R", (64, 32), 4),  # activations: tp alone
)


def test_k0_is_the_existing_groups_time():
    a = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=0, cost=MODEL).to_dict()
    assert a["groups"] == []
    assert a["total"]["advised"] == dict(a["total"]["existing"], group_creation_s=0.0)
    assert a["total"]["existing"]["time_s"] == pytest.approx(_replanned_time(SPEC3, STEP3))
    assert a["total"]["torch"]["collectives"] == 2 * 2 + 3 + 4  # DTensor: one per mesh dim
    assert a["search"] == "exact"


def test_advised_time_is_the_replanned_time_with_the_group():
    a = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=1, cost=MODEL)
    assert a.flatten_lines == ['mesh["dp", "cp"]._flatten()']
    d = a.to_dict()
    with_group = SPEC3.with_flattened([("dp", "cp")])
    assert d["total"]["advised"]["time_s"] == pytest.approx(_replanned_time(with_group, STEP3))
    assert d["total"]["advised"]["group_creation_s"] == pytest.approx(
        MODEL.create_group / MODEL.expected_reuse
    )
    # gradients 2 x (AR(dp), AR(cp)) -> 2 x AR(dp+cp); the loss AR(dp), AR(cp), AR(tp) -> AR(dp+cp), AR(tp)
    assert (d["total"]["existing"]["collectives"], d["total"]["advised"]["collectives"]) == (11, 8)
    by_site = {s["site"]: s["rows"] for s in d["sites"]}
    assert (
        by_site["site0"]["advised"]["collectives"] == 2 and by_site["site0"]["existing"]["collectives"] == 4
    )
    assert by_site["site2"]["advised"] == by_site["site2"]["existing"]  # tp alone: nothing to gain
    assert "dp+cp" in str(a) and "total" in str(a)
    assert a.to_svg().count('class="advised"') == len(d["sites"]) + 1


def test_two_groups_when_two_pay():
    a = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=2, cost=MODEL)
    # the loss's P,P,P -> R,R,R wants all three dims; the gradients dp+cp
    assert set(a.flatten_lines) == {'mesh["dp", "cp"]._flatten()', 'mesh["dp", "cp", "tp"]._flatten()'}


def test_creation_cost_is_priced():
    costly = dataclasses.replace(MODEL, create_group=1e6)  # never amortized
    a = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=3, cost=costly)
    assert a.groups == [] and "no new group" in str(a)


def test_a_group_that_saves_nothing_is_not_advised():
    step = _entries(("S(0),R,R", "R,R,R", (16, 8), 3), ("R,R,P", "R,R,R", (16, 8), 1))
    assert advise([mesh_record_of_spec(SPEC3)], step, max_new_groups=2, cost=MODEL).groups == []


def test_existing_groups_are_no_candidates():
    spec = redist_opt.MeshSpec(sizes=(2, 2, 2), names=("dp", "cp", "tp"), flattened=[("dp", "cp")])
    labels = [c.label for c in candidates([mesh_record_of_spec(spec)])]
    assert labels == ["dp+tp", "cp+tp", "dp+cp+tp"]
    # size-1 dims never make a group
    spec = redist_opt.MeshSpec(sizes=(2, 1, 2), names=("a", "b", "c"))
    assert [c.label for c in candidates([mesh_record_of_spec(spec)])] == ["a+c"]


def test_submesh_and_root_share_a_candidate():
    root = mesh_record_of_spec(SPEC3)
    sub = redist_opt.MeshSpec(
        sizes=(2, 2), names=("dp", "cp"), dim_layouts=SPEC3.dim_layouts[:2], index_space=8
    )
    sub_rec = mesh_record_of_spec(sub, root=root["root"])
    pool = candidates([root, sub_rec])
    assert [c.label for c in pool] == ["dp+cp", "dp+tp", "cp+tp", "dp+cp+tp"]


CASES = [
    (redist_opt.MeshSpec(sizes=(2, 2, 2), names=("dp", "cp", "tp")), STEP3),
    (
        redist_opt.MeshSpec(sizes=(2, 2, 2, 2), names=("pp", "dp", "cp", "tp")),
        _entries(
            ("R,P,P,S(1)", "R,R,R,S(1)", (64, 64), 2),
            ("R,P,P,P", "R,R,R,R", (), 1),
            ("P,R,R,P", "R,R,R,R", (128, 16), 1),
            ("R,S(0),S(0),R", "R,R,R,R", (32, 8), 2),
        ),
    ),
    (
        redist_opt.MeshSpec(sizes=(4, 2, 2), names=("dp", "cp", "tp"), flattened=[("cp", "tp")]),
        _entries(("P,P,P", "R,S(0),R", (64, 64), 3), ("P,R,P", "R,R,R", (8, 8), 5)),
    ),
]


@pytest.mark.parametrize("spec, step", CASES, ids=["2x2x2", "2x2x2x2", "4x2x2-cp_tp"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_exact_and_greedy_agree_on_small_cases(spec, step, k):
    planner = advice._Planner([mesh_record_of_spec(spec)], step, MODEL)
    pool = candidates(planner.meshes)
    exact, how = search(planner, pool, k)
    assert how == "exact"
    fast = greedy(planner, pool, k)
    assert planner.step_time(fast) == pytest.approx(planner.step_time(exact))
    # exact really is the minimum over every subset of size <= k
    every = min(planner.step_time(c) for j in range(k + 1) for c in itertools.combinations(pool, j))
    assert planner.step_time(exact) == pytest.approx(every)
    assert len(exact) <= k


def test_greedy_beyond_the_exact_limit(monkeypatch):
    monkeypatch.setattr(advice, "EXACT_LIMIT", 1)
    a = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=1, cost=MODEL).to_dict()
    assert a["search"] == "greedy" and [g["label"] for g in a["groups"]] == ["dp+cp"]


def test_unplannable_entries_are_listed_not_priced():
    step = STEP3 + [
        dict(
            _entries(("P(prod)", "R", (4,), 1))[0],
            torch_only="Partial('prod') is not lowered",
            site={"label": "prod"},
        )
    ]
    d = advise([mesh_record_of_spec(SPEC3)], step, max_new_groups=1, cost=MODEL).to_dict()
    prod = next(s for s in d["sites"] if s["site"] == "prod")
    assert prod["rows"]["torch"]["collectives"] == 0 and "runs through torch" in prod["redistributions"][0]


def test_negative_k_is_refused():
    with pytest.raises(redist_opt.RedistributeError, match="max_new_groups"):
        advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=-1)


def test_candidate_code_without_dim_names():
    spec = redist_opt.MeshSpec(sizes=(2, 2))
    (c,) = candidates([mesh_record_of_spec(spec)])
    assert isinstance(c, Candidate) and c.code.startswith("# mesh dims (0, 1)")


def test_torch_column_runs_torchs_merge_pass_on_the_flattened_groups():
    spec = redist_opt.MeshSpec(sizes=(2, 2, 2), names=("dp", "cp", "tp"), flattened=[("dp", "cp")])
    d = advise([mesh_record_of_spec(spec)], STEP3, max_new_groups=0, cost=MODEL).to_dict()
    # gradients: AR(dp), AR(cp) merge into AR(dp+cp); the loss's run of three all_reduces
    # needs a dp+cp+tp group, so torch keeps it as three; the activations: AR(tp)
    assert d["total"]["torch"]["collectives"] == 2 * 1 + 3 + 4
    # with dp+cp advised, torch alone finds it as well
    d = advise([mesh_record_of_spec(SPEC3)], STEP3, max_new_groups=1, cost=MODEL).to_dict()
    assert [g["label"] for g in d["groups"]] == ["dp+cp"] and d["total"]["torch_advised"]["collectives"] == 9
    # a recording that names no flattened mesh: torch finds none, whatever else exists
    rec = dict(mesh_record_of_spec(spec), flattened=[])
    assert advise([rec], STEP3, max_new_groups=0, cost=MODEL).to_dict()["total"]["torch"]["collectives"] == 11
