"""The corpus of real parallelism layouts (redist_opt/tools/corpus.json, shipped as package data).

* schema: every case parses to a valid mesh (with its flattened groups) and
  placements, at least 40 cases, every category present, sources
  and reasons non-empty, the simulation shape keeps the sharding pattern;
* a small sample runs differentially through ``harness.check_case``: our
  output equals torch's redistribute with its merge pass disabled, rank by rank,
  with no more collectives.
"""

from __future__ import annotations

import json
import math

import pytest
from support import harness, meshes
from support.inputs import pstr
from torch.distributed.device_mesh import init_device_mesh

import redist_opt
from benchmarks.quality import sim_shape
from redist_opt.ir.mesh import MeshSpec
from redist_opt.tools.corpus import CATEGORIES, DEFAULT_CORPUS, load_corpus

CASES = load_corpus()
BY_ID = {c.id: c for c in CASES}


def test_corpus_size_and_categories():
    assert len(CASES) >= 40
    assert {c.category for c in CASES} == set(CATEGORIES)
    with DEFAULT_CORPUS.open(encoding="utf-8") as f:
        described = json.load(f)["categories"]
    assert set(described) == set(CATEGORIES)


def test_required_layouts_present():
    meshes = {tuple(c.spec().sizes) for c in CASES}
    assert (5, 8) in meshes and (3, 4) in meshes  # jagged meshes
    four_d = [c for c in CASES if c.category == "4d"]
    assert any(c.spec().ndim >= 4 and c.spec().names[0] == "pp" for c in four_d)
    # torchtitan's flattened meshes: dp, dp_shard_cp, dp_cp
    flats = {g for c in four_d for g in c.flatten}
    assert {"dp_replicate+dp_shard", "dp_shard+cp", "dp_replicate+dp_shard+cp"} <= flats
    norms = [c.placements()[0] for c in CASES if c.category == "grad_norm"]
    assert {p.reduce_op for ps in norms for p in ps if p.is_partial()} == {"sum", "max"}
    losses = [c.placements()[0] for c in CASES if c.category == "loss"]
    assert any({p.reduce_op for p in ps if p.is_partial()} == {"avg", "sum"} for ps in losses)  # mixed
    assert any({p.reduce_op for p in ps if p.is_partial()} == {"avg"} for ps in losses)
    ep = [c for c in CASES if c.category == "ep"]
    assert any(c.flatten for c in ep)  # dispatch over a flattened ep mesh
    assert any(_uneven_dims(c) for c in CASES if c.category == "uneven")
    assert all(_uneven_dims(c) for c in CASES if c.category == "uneven")


def _uneven_dims(case) -> list[int]:
    """Tensor dims some mesh dim shards unevenly (torch.chunk pieces of different sizes)."""
    spec = case.spec()
    src, dst = case.placements()
    out = []
    for d, n in enumerate(case.shape):
        m = math.prod(
            s for s, a, b in zip(spec.sizes, src, dst) if any(p.is_shard() and p.dim == d for p in (a, b))
        )
        if n % m:
            out.append(d)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_schema(case):
    assert case.source.strip() and case.why.strip()
    # names the framework and the place: a file of it
    assert any(fw in case.source for fw in ("torchtitan", "torch ", "DeepSpeed", "transformers")), case.source
    assert ".py" in case.source, case.source
    spec = case.spec()
    assert isinstance(spec, MeshSpec) and spec.names is not None
    for g in case.flatten:
        dims = spec.dims_of(g)
        assert len(dims) >= 2 and list(dims) == sorted(dims), f"{g}: DeviceMesh flattens ascending dims"
        assert spec.group_exists(spec.group(dims))
    src, dst = case.placements()
    assert len(src) == len(dst) == spec.ndim
    assert src != dst
    sim, scale = sim_shape(case)
    assert len(sim) == len(case.shape) and scale * math.prod(sim) == math.prod(case.shape)
    # The simulation shape shards like the real one: even dims stay even, uneven stay as they are.
    for d, (n, m) in enumerate(zip(case.shape, sim)):
        sharding = math.prod(
            s for s, a, b in zip(spec.sizes, src, dst) if any(p.is_shard() and p.dim == d for p in (a, b))
        )
        assert (n % sharding == 0) == (m % sharding == 0)
    assert case.spec().num_ranks <= 64


def test_load_corpus_rejects_bad_cases(tmp_path):
    good = json.loads(DEFAULT_CORPUS.read_text(encoding="utf-8"))["cases"][0]
    for bad, match in [
        (dict(good, category="nope"), "category"),
        (dict(good, mesh="dp=2,dp=2"), "not unique"),
        (dict(good, flatten=["dp_shard+zz"]), "zz"),
        (dict(good, src="S(0),S(0)"), "entries"),
        (dict(good, source=""), "source"),
        ({k: v for k, v in good.items() if k != "source"}, "missing"),
        (dict(good, shape=[0, 4]), "shape"),
    ]:
        p = tmp_path / "c.json"
        p.write_text(json.dumps({"cases": [bad]}))
        with pytest.raises(ValueError, match=match):
            load_corpus(p)
    p = tmp_path / "dup.json"
    p.write_text(json.dumps({"cases": [good, good]}))
    with pytest.raises(ValueError, match="duplicate"):
        load_corpus(p)


# -- differential sample ---------------------------------------------------------------

SAMPLE = [
    "hsdp_cp_grad",  # 3 partial dims -> reduce_scatter + all_reduce
    "fsdp_dp_shard_cp_param",  # merged all_gather on dp_shard_cp
    "ep_dispatch_borrow_cp",  # one all_to_all over the flattened ep mesh
    "gradnorm_3d",  # partial merge of all_reduces
    "uneven_nested_reduce_scatter",  # uneven merged reduce_scatter (torch refuses)
    "jagged_3x4_nested_uneven",  # 12 ranks, uneven nested all_gather (torch's is wrong)
    "loss_per_token_mixed",  # mixed P(avg)/P(sum): all_reduce sum over tp, avg over cp
]


def _factory(case) -> meshes.MeshFactory:
    spec = case.spec()

    def build():
        mesh = init_device_mesh("cpu", spec.sizes, mesh_dim_names=spec.names)
        for g in case.flatten:
            mesh[tuple(spec.names[d] for d in spec.dims_of(g))]._flatten()
        return mesh

    return meshes.MeshFactory(f"corpus:{case.id}", spec.num_ranks, build)


@pytest.mark.parametrize("case_id", SAMPLE)
def test_sample_differential(case_id):
    case = BY_ID[case_id]
    src, dst = case.placements()
    redist_opt.plan(case.spec(), src, dst, shape=case.shape)
    assert case.spec().num_ranks <= meshes.WORLD_SIZE
    sim, _ = sim_shape(case)
    # inputs.build_input draws randn(*shape), which needs a dim: a scalar norm runs as
    # a 1-element vector (the same collectives).
    sim = sim or (1,)
    harness.check_case(
        _factory(case), [pstr(p) for p in src], [pstr(p) for p in dst], sim, case.torch_dtype()
    )
