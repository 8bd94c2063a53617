"""The alpha-beta cost model: formulas, profiles, JSON round trip, and the calibration fit.

No timing here: these check what the *model* says (speed targets live in
``redist-opt bench``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

import redist_opt
from redist_opt.ir.cost import KINDS, PROFILE_FORMAT, CostModel, declare_slower_in_steps, steps_and_bytes
from redist_opt.ir.cost_fit import fit_alpha_beta
from redist_opt.tools.args import format_size, parse_size, parse_sizes
from redist_opt.tools.bench import bench_shape
from redist_opt.tools.timing import Stat

KiB, MiB = 1024, 1024**2

MESH = redist_opt.MeshSpec(sizes=(2, 2, 2), names=("a", "b", "c"))
PAIR_GROUPS = [MESH.group((d,)) for d in range(3)]
WHOLE = MESH.group((0, 1, 2))


def unit(**kw) -> CostModel:
    """A model whose time is a pure step count (alpha=1 s) or byte count (bw=1 B/s)."""
    base = dict(
        name="unit",
        launch=0.0,
        alpha_intra=0.0,
        alpha_inter=0.0,
        bw_intra=1e30,
        bw_inter=1e30,
        devices_per_host=None,
        create_group=0.0,
    )
    base.update(kw)
    return CostModel(**base)


# -- formulas -------------------------------------------------------------------------


@pytest.mark.parametrize("dims, p", [((0,), 2), ((0, 1), 4), ((0, 1, 2), 8)])
def test_ring_latency_steps(dims, p):
    steps = unit(alpha_intra=1.0, algorithm="ring")
    g = MESH.group(dims)
    assert g.size == p
    assert steps.collective_time("all_reduce", g, 4096, MESH) == pytest.approx(2 * (p - 1))
    assert steps.collective_time("reduce_scatter", g, 4096, MESH) == pytest.approx(p - 1)
    assert steps.collective_time("all_gather", g, 4096, MESH) == pytest.approx(p - 1)
    assert steps.collective_time("all_to_all", g, 4096, MESH) == pytest.approx(p - 1)


@pytest.mark.parametrize("dims, p", [((0,), 2), ((0, 1), 4), ((0, 1, 2), 8)])
def test_tree_latency_steps(dims, p):
    steps = unit(alpha_intra=1.0, algorithm="tree")
    g = MESH.group(dims)
    log_p = math.ceil(math.log2(p))
    assert steps.collective_time("all_reduce", g, 4096, MESH) == pytest.approx(2 * log_p)
    assert steps.collective_time("reduce_scatter", g, 4096, MESH) == pytest.approx(log_p)
    assert steps.collective_time("all_gather", g, 4096, MESH) == pytest.approx(log_p)
    assert steps.collective_time("all_to_all", g, 4096, MESH) == pytest.approx(p - 1)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_bytes_moved(algorithm):
    """Bandwidth term: all_reduce moves 2n(p-1)/p, reduce_scatter n(p-1)/p, all_gather n(p-1)."""
    by_bytes = unit(bw_intra=1.0, algorithm=algorithm)
    n, p = 8192, 8
    assert by_bytes.collective_time("all_reduce", WHOLE, n, MESH) == pytest.approx(2 * n * (p - 1) / p)
    assert by_bytes.collective_time("reduce_scatter", WHOLE, n, MESH) == pytest.approx(n * (p - 1) / p)
    assert by_bytes.collective_time("all_gather", WHOLE, n, MESH) == pytest.approx(n * (p - 1))
    assert by_bytes.collective_time("all_to_all", WHOLE, n, MESH) == pytest.approx(n * (p - 1) / p)


def test_launch_and_trivial_groups():
    m = unit(launch=5.0)
    assert m.collective_time("all_gather", WHOLE, 1, MESH) == pytest.approx(5.0)
    one = redist_opt.MeshSpec(sizes=(1, 4)).group((0,))
    assert CostModel.profile("gloo").collective_time("all_reduce", one, MiB, None) == 0.0
    with pytest.raises(ValueError, match="unknown collective kind 'broadcast'"):
        m.collective_time("broadcast", WHOLE, 1, MESH)
    with pytest.raises(ValueError, match="unknown collective kind"):
        m.collective_time("broadcast", one, 1, MESH)


def test_reduce_scatter_as_all_reduce():
    """gloo runs reduce_scatter as an all_reduce: the model can say so."""
    emul = CostModel.profile("gloo-ring")
    assert emul.reduce_scatter_as_all_reduce  # measured on gloo
    m = dataclasses.replace(emul, reduce_scatter_as_all_reduce=False)
    for n in (KiB, MiB):
        assert emul.collective_time("reduce_scatter", WHOLE, n, MESH) == m.collective_time(
            "all_reduce", WHOLE, n, MESH
        )
        assert m.collective_time("reduce_scatter", WHOLE, n, MESH) < m.collective_time(
            "all_reduce", WHOLE, n, MESH
        )
        assert emul.collective_time("all_gather", WHOLE, n, MESH) == m.collective_time(
            "all_gather", WHOLE, n, MESH
        )


def merged_vs_separate(model: CostModel, nbytes: int) -> tuple[float, float]:
    merged = model.collective_time("all_reduce", WHOLE, nbytes, MESH)
    separate = sum(model.collective_time("all_reduce", g, nbytes, MESH) for g in PAIR_GROUPS)
    return merged, separate


def test_merging_reductions_under_ring_gloo():
    """One ring all_reduce over 8 ranks: 14 alpha steps and 1.75N bytes; three over pairs:
    6 steps and 3N bytes. The gloo-ring profile says merged is slower at 64 KiB, faster at 1 MiB."""
    gloo = CostModel.profile("gloo-ring")
    assert gloo.algorithm == "ring"
    merged, separate = merged_vs_separate(gloo, 64 * KiB)
    assert merged > separate
    merged, separate = merged_vs_separate(gloo, 1 * MiB)
    assert merged < separate
    # The step counts behind it.
    s8, b8 = steps_and_bytes("all_reduce", 8, 1.0, "ring")
    s2, b2 = steps_and_bytes("all_reduce", 2, 1.0, "ring")
    assert (s8, 3 * s2) == (14, 6)
    assert (b8, 3 * b2) == (pytest.approx(1.75), pytest.approx(3.0))


def test_merging_reductions_under_tree_nccl():
    """NCCL-like (tree, low latency): merging wins at every size."""
    nccl = CostModel.default()
    for n in (KiB, 64 * KiB, MiB, 64 * MiB):
        merged, separate = merged_vs_separate(nccl, n)
        assert merged < separate, n


def test_intra_and_inter_host_links():
    m = CostModel(
        alpha_intra=1.0,
        alpha_inter=10.0,
        launch=0.0,
        bw_intra=1e30,
        bw_inter=1e30,
        devices_per_host=4,
        algorithm="ring",
    )
    # Row-major 2x2x2: dim c has stride 1, b stride 2, a stride 4; 4 ranks per host.
    assert m.collective_time("all_gather", MESH.group((2,)), 64, MESH) == pytest.approx(1.0)
    assert m.collective_time("all_gather", MESH.group((1, 2)), 64, MESH) == pytest.approx(3.0)
    assert m.collective_time("all_gather", MESH.group((0,)), 64, MESH) == pytest.approx(10.0)
    assert m.collective_time("all_gather", WHOLE, 64, MESH) == pytest.approx(70.0)
    # No mesh given, or all on one host: intra.
    assert m.collective_time("all_gather", MESH.group((0,)), 64, None) == pytest.approx(1.0)


def test_group_creation_amortized():
    m = CostModel(create_group=2.0, expected_reuse=100)
    assert m.group_creation_time(WHOLE, MESH) == pytest.approx(0.02)


def test_plan_time_sums_collectives():
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a", "b"))
    p = redist_opt.plan(spec, "P,P", "R,R", shape=(8, 4))
    gloo = CostModel.profile("gloo")
    colls = p.collectives()
    assert [c.kind for c in colls] == ["all_reduce", "all_reduce"]
    expected = sum(gloo.collective_time(c.kind, c.group, c.bytes_in, spec) for c in colls)
    assert gloo.plan_time(p) == pytest.approx(expected)
    assert expected == pytest.approx(
        2 * gloo.collective_time("all_reduce", spec.group((0,)), 8 * 4 * 4, spec)
    )


# -- save / load ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        CostModel.default(),
        CostModel.profile("gloo"),
        CostModel(
            name="odd",
            launch=1.5e-6,
            alpha_intra=3.25e-5,
            alpha_inter=1e-3,
            bw_intra=1.234567e9,
            bw_inter=7e8,
            devices_per_host=4,
            algorithm="ring",
            create_group=0.1,
            expected_reuse=7,
            reduce_scatter_as_all_reduce=True,
        ),
    ],
    ids=["default", "gloo", "custom"],
)
def test_save_load_round_trip(tmp_path, model):
    path = tmp_path / "profile.json"
    model.save(path)
    loaded = CostModel.load(path)
    assert loaded == model
    assert hash(loaded) == hash(model)  # the pipeline caches on the model
    data = json.loads(path.read_text())
    assert data["format"] == PROFILE_FORMAT
    assert CostModel.from_dict(data["model"]) == model
    assert CostModel.from_dict(model.to_dict()) == model
    for kind in KINDS:
        assert loaded.collective_time(kind, WHOLE, 64 * KiB, MESH) == model.collective_time(
            kind, WHOLE, 64 * KiB, MESH
        )


def test_save_keeps_calibration_record(tmp_path):
    path = tmp_path / "p.json"
    CostModel.profile("gloo").save(path, calibration={"nprocs": 4, "measurements": [{"kind": "all_reduce"}]})
    data = json.loads(path.read_text())
    assert data["calibration"]["nprocs"] == 4
    assert CostModel.load(path) == CostModel.profile("gloo")
    assert not list(tmp_path.glob("*.tmp*"))


def test_partial_dict_uses_defaults():
    assert CostModel.from_dict({"name": "x", "launch": 1}) == CostModel(name="x", launch=1.0)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"launch": 1.0, "bogus": 2}, "unknown field"),
        ({"algorithm": "butterfly"}, "algorithm 'butterfly'"),
        ({"launch": -1.0}, "launch=-1.0"),
        ({"bw_intra": 0}, "bw_intra"),
        ({"launch": "fast"}, "must be a number"),
        ({"reduce_scatter_as_all_reduce": "yes"}, "true or false"),
        ({"devices_per_host": 2.5}, "integer"),
        ({"expected_reuse": 0}, "expected_reuse"),
        ({"slower_in_steps": "merge-reductions"}, "slower_in_steps='merge-reductions'"),
        ({"slower_in_steps": [3]}, "list of pass names"),
        ({"format": "other/9", "model": {}}, "format 'other/9'"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_profiles(data, match):
    with pytest.raises(ValueError, match=match):
        CostModel.from_dict(data)


def test_the_gloo_profiles_pass_decision_is_declared_above_the_passes(monkeypatch):
    from redist_opt import gloo_step_decision
    from redist_opt.ir import cost

    assert CostModel.profile("gloo").slower_in_steps == gloo_step_decision.SLOWER_IN_STEPS != ()
    monkeypatch.setattr(cost, "_SLOWER_IN_STEPS", {})  # as if the pipeline had not declared it
    with pytest.raises(RuntimeError, match="'gloo' profile's slower_in_steps was not declared"):
        CostModel.profile("gloo")
    assert CostModel.profile("gloo-ring").slower_in_steps == ()  # nothing to declare


def test_slower_in_steps_is_checked_when_the_model_is_built():
    # however it is built: a bare string would read as one pass per letter
    with pytest.raises(ValueError, match="slower_in_steps='merge-reductions' must be a list of pass names"):
        CostModel(slower_in_steps="merge-reductions")
    with pytest.raises(ValueError, match="list of pass names"):
        dataclasses.replace(CostModel(), slower_in_steps=("",))
    assert CostModel(slower_in_steps=["merge-reductions"]).slower_in_steps == ("merge-reductions",)
    with pytest.raises(ValueError, match="unknown cost profile 'mine'"):
        declare_slower_in_steps("mine", ())


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"format": PROFILE_FORMAT, "model": {"algorithm": "x"}}))
    with pytest.raises(ValueError, match="bad.json.*algorithm"):
        CostModel.load(bad)


# -- the calibration fit -----------------------------------------------------------------------


def synthetic(model: CostModel, *, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """What `calibrate` would measure if the machine were exactly ``model`` (times noise)."""
    rng = random.Random(seed)
    spec = redist_opt.MeshSpec(sizes=(2, 2, 2))
    out = []
    for dims in [(0,), (2,), (0, 1), (0, 1, 2)]:
        g = spec.group(dims)
        for nbytes in parse_sizes("1KiB..4MiB*4"):
            for kind in KINDS:
                t = model.collective_time(kind, g, nbytes, spec)
                out.append(
                    dict(kind=kind, p=g.size, nbytes=nbytes, time=t * (1 + noise * rng.uniform(-1, 1)))
                )
    return out


TRUTHS = [
    CostModel(
        name="t1",
        launch=30e-6,
        alpha_intra=60e-6,
        alpha_inter=60e-6,
        bw_intra=1.5e9,
        bw_inter=1.5e9,
        devices_per_host=None,
        algorithm="ring",
    ),
    CostModel(
        name="t2",
        launch=10e-6,
        alpha_intra=2e-6,
        alpha_inter=2e-6,
        bw_intra=150e9,
        bw_inter=150e9,
        devices_per_host=None,
        algorithm="tree",
    ),
    CostModel(
        name="t3",
        launch=1e-3,
        alpha_intra=1e-3,
        alpha_inter=1e-3,
        bw_intra=3e8,
        bw_inter=3e8,
        devices_per_host=None,
        algorithm="ring",
        reduce_scatter_as_all_reduce=True,
    ),
]


@pytest.mark.parametrize("truth", TRUTHS, ids=[t.name for t in TRUTHS])
def test_fit_recovers_known_parameters(truth):
    fit = fit_alpha_beta(synthetic(truth))
    assert fit.algorithm == truth.algorithm
    assert fit.reduce_scatter_as_all_reduce == truth.reduce_scatter_as_all_reduce
    assert fit.launch == pytest.approx(truth.launch, rel=1e-6)
    assert fit.alpha == pytest.approx(truth.alpha_intra, rel=1e-6)
    assert fit.bw == pytest.approx(truth.bw_intra, rel=1e-6)
    assert fit.rms_rel_error < 1e-9
    model = fit.model(name="fitted")
    for m in synthetic(truth)[:10]:
        g = redist_opt.MeshSpec(sizes=(m["p"],)).group((0,))
        assert model.collective_time(m["kind"], g, m["nbytes"]) == pytest.approx(m["time"], rel=1e-6)


def test_fit_with_noise_stays_close():
    truth = TRUTHS[0]
    fit = fit_alpha_beta(synthetic(truth, noise=0.05, seed=3))
    assert fit.algorithm == "ring"
    assert fit.launch == pytest.approx(truth.launch, rel=0.5)
    assert fit.alpha == pytest.approx(truth.alpha_intra, rel=0.15)
    assert fit.bw == pytest.approx(truth.bw_intra, rel=0.1)
    assert 0 < fit.rms_rel_error < 0.05
    assert set(fit.errors) == {"ring", "tree", "ring, rs=ar", "tree, rs=ar"}


def test_fit_keeps_parameters_non_negative():
    # Times that fall with size would need a negative bandwidth term: clamp it to 0.
    ms = [
        dict(kind="all_reduce", p=2, nbytes=n, time=t) for n, t in [(1024, 3e-3), (4096, 2e-3), (16384, 1e-3)]
    ]
    fit = fit_alpha_beta(ms)
    assert fit.launch >= 0 and fit.alpha >= 0 and fit.bw > 0


def test_fit_needs_points():
    with pytest.raises(ValueError, match="at least 3"):
        fit_alpha_beta([dict(kind="all_reduce", p=2, nbytes=1024, time=1e-3)])


# -- helpers of the measuring code ---------------------------------------------------------------


def test_parse_sizes():
    assert parse_size("64KiB") == 65536
    assert parse_size("1M") == MiB
    assert parse_size("4096") == 4096
    assert parse_size("1kb") == 1000
    assert parse_sizes("1KiB,64KiB") == [KiB, 64 * KiB]
    assert parse_sizes("1KiB..4MiB") == [KiB * 2**i for i in range(13)]
    assert parse_sizes("1KiB..4MiB*4") == [KiB * 4**i for i in range(7)]
    assert parse_sizes("4MiB,1KiB..2KiB,1KiB") == [KiB, 2 * KiB, 4 * MiB]
    assert [format_size(s) for s in (KiB, 64 * KiB, 4 * MiB, 1000)] == ["1KiB", "64KiB", "4MiB", "1000B"]
    for bad in ("", "lots", "1XB", "4MiB..1KiB", "1KiB..4MiB*1", "0", "1.5"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_stat_takes_slowest_rank_per_sample():
    per_rank = [[1.0, 2.0, 3.0, 10.0], [2.0, 1.0, 3.5, 1.0]]
    s = Stat.of(per_rank)
    assert s.samples == (2.0, 2.0, 3.5, 10.0)
    assert s.median == pytest.approx(2.75)
    assert s.stderr > 0
    assert Stat.of([[1.0, 1.0, 1.0]]).stderr == 0.0


@pytest.mark.parametrize("nbytes", [KiB, 8 * KiB, 64 * KiB, 512 * KiB, 4 * MiB, 3 * KiB])
def test_bench_shape(nbytes):
    rows, cols = bench_shape(nbytes)
    assert rows * cols * 4 == nbytes
    if nbytes & (nbytes - 1) == 0:
        assert rows % 4 == 0 and cols % 4 == 0 and rows >= cols
