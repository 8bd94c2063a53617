"""Which cost profile a plan uses: the mesh's backend, or a file
named by $REDIST_OPT_COST_PROFILE; shown in explain and in the plan dumps."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist
from support.ir_text import mesh, signature
from support.paths import ROOT
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh

import redist_opt
import redist_opt.api.specs
from redist_opt.debug import dump
from redist_opt.ir import cost
from redist_opt.ir.cost import PROFILE_ENV, CostModel
from redist_opt.passes import MergeReductionsIntoAllReduce
from redist_opt.tools import cli

# A profile under which merging three pair all_reduces into one ring over 8 ranks
# does not pay (latency-bound ring), so it visibly changes the plan.
SLOW_RING = CostModel(
    name="calibrated-slow-ring", launch=0.0, alpha_intra=1e-3, bw_intra=1e12, algorithm="ring"
)


def _p3():
    return redist_opt.plan(mesh((2, 2, 2), ["a+b+c"]), "P,P,P", "R,R,R", shape=(4, 4))


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)


def test_rank_free_spec_gets_default(no_env):
    opt = redist_opt.optimize(_p3())
    assert opt.cost_profile == "nccl (default: no backend known)"
    assert signature(opt) == ["all_reduce[sum](a+b+c)"]


@pytest.mark.parametrize(
    "backend, profile", [("gloo", "gloo"), ("nccl", "nccl"), ("fake", "nccl"), ("mpi", "nccl")]
)
def test_backend_picks_profile(no_env, backend, profile):
    spec = redist_opt.MeshSpec((2, 2), ("a", "b"), backend=backend)
    model, source = cost.resolve(spec)
    assert model == CostModel.profile(profile)
    assert source == f"mesh backend {backend}"
    p = redist_opt.plan(spec, "P,P", "R,S(0)", shape=(8, 4))
    assert redist_opt.optimize(p).cost_profile == f"{profile} (mesh backend {backend})"


def test_fake_mesh_gets_default(no_env):
    with LocalTensorMode(4) as lm:
        with lm.disable():
            dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        spec = redist_opt.api.specs.spec_of(dm)
    assert dist.get_backend() == "fake"
    assert spec.backend == "fake"
    p = redist_opt.plan(spec, "P,P", "R,R", shape=(8, 4))
    assert redist_opt.optimize(p).cost_profile == "nccl (mesh backend fake)"


GLOO_SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile
    sys.path.insert(0, {root!r})
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import redist_opt, redist_opt.api
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dm = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
    spec = redist_opt.api.specs.spec_of(dm)
    opt = redist_opt.optimize(redist_opt.plan(dm, "P,P", "R,R", shape=(4,)))
    print(spec.backend, "|", opt.cost_profile)
    dist.destroy_process_group()
    """
)


@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_gloo_mesh_gets_gloo_profile():
    env = {k: v for k, v in os.environ.items() if k != PROFILE_ENV}
    out = subprocess.run(
        [sys.executable, "-c", GLOO_SCRIPT.format(root=ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "gloo | gloo (mesh backend gloo)"


def test_env_profile_file_is_honoured(tmp_path, monkeypatch):
    path = tmp_path / "calibrated.json"
    SLOW_RING.save(path, calibration={"note": "as `redist-opt calibrate` writes it"})
    monkeypatch.setenv(PROFILE_ENV, str(path))
    # The file wins over the backend's profile, and changes the decision: under it,
    # opting in to more collectives than torch, the three pair all_reduces stay separate.
    p = _p3()
    opt = redist_opt.optimize(p, max_collectives="any")
    assert opt.cost_profile == f"calibrated-slow-ring ({PROFILE_ENV}={path})"
    assert sorted(signature(opt)) == ["all_reduce[sum](a)", "all_reduce[sum](b)", "all_reduce[sum](c)"]
    # by default the plan keeps torch's count: its one all_reduce over a+b+c
    capped = redist_opt.optimize(p)
    assert capped.cost_profile == f"calibrated-slow-ring ({PROFILE_ENV}={path})"
    assert signature(capped) == ["all_reduce[sum](a+b+c)"]
    gloo = redist_opt.plan(redist_opt.MeshSpec((2, 2), ("a", "b"), backend="gloo"), "P,P", "R,R", shape=(4,))
    assert redist_opt.optimize(gloo).cost_profile.startswith("calibrated-slow-ring (")
    # A built-in name works too.
    monkeypatch.setenv(PROFILE_ENV, "gloo")
    assert redist_opt.optimize(p).cost_profile == f"gloo ({PROFILE_ENV}=gloo)"
    monkeypatch.delenv(PROFILE_ENV)
    assert signature(redist_opt.optimize(p)) == ["all_reduce[sum](a+b+c)"]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read the cost profile"),
        ("{", "is not valid JSON"),
        (
            json.dumps({"format": "redist_opt.ir.cost/1", "model": {"launch": "fast"}}),
            "launch='fast' must be a number",
        ),
        (json.dumps({"format": "redist_opt.ir.cost/1", "model": {"warp": 1}}), "unknown field"),
        (json.dumps({"format": "other/9", "model": {}}), "format 'other/9'"),
    ],
)
def test_bad_env_profile_gives_clear_error(tmp_path, monkeypatch, content, message):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv(PROFILE_ENV, str(path))
    with pytest.raises(ValueError, match=PROFILE_ENV) as e:
        redist_opt.optimize(_p3())
    assert message in str(e.value)
    assert str(path) in str(e.value)


def test_explain_shows_the_profile(tmp_path, monkeypatch, capsys):
    argv = ["explain", "--mesh", "a=2,b=2", "--src", "P,P", "--dst", "R,S(0)", "--shape", "8,4", "--no-ir"]
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert cli.main(argv + ["--backend", "gloo"]) == 0
    assert (
        "cost model: gloo (ring algorithms, all ranks on one host; mesh backend gloo)"
        in capsys.readouterr().out
    )
    assert cli.main(argv) == 0
    assert (
        "cost model: nccl (tree algorithms, all ranks on one host; default: no backend known)"
        in capsys.readouterr().out
    )
    path = tmp_path / "cal.json"
    SLOW_RING.save(path)
    monkeypatch.setenv(PROFILE_ENV, str(path))
    assert cli.main(argv + ["--backend", "gloo", "--format", "json"]) == 0
    cm = json.loads(capsys.readouterr().out)["cost_model"]
    assert cm["name"] == "calibrated-slow-ring" and cm["source"] == f"{PROFILE_ENV}={path}"
    path.write_text("not json")
    assert cli.main(argv) == 2
    assert PROFILE_ENV in capsys.readouterr().err


def test_dumps_show_the_profile(tmp_path, monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv(dump.DUMP_DIR_ENV, str(tmp_path))
    spec = redist_opt.MeshSpec((2, 2), ("a", "b"), flattened=["a+b"], backend="gloo")
    opt = redist_opt.optimize(redist_opt.plan(spec, "P,P", "R,R", shape=(1024, 1024)))  # merges under gloo
    assert "  cost model: gloo (mesh backend gloo)" in str(opt).splitlines()
    after = sorted(tmp_path.glob("*.after_*.txt"))
    assert after and all("cost model: gloo (mesh backend gloo)" in f.read_text() for f in after)


def test_backend_per_device_string(monkeypatch):
    # get_backend names one backend per device for mixed process groups.
    from redist_opt.ir import layout as mesh_mod
    from redist_opt.torch_api import mesh as tm

    class FakeMesh:
        def __init__(self, device_type, sizes=(2, 2)):
            self.device_type, self.sizes, self.ndim = device_type, sizes, len(sizes)

        def size(self, d):
            return self.sizes[d]

    # dim d's group is named and resolved to "pg<d>" (group names are read as funcol reads them)
    monkeypatch.setattr(tm, "rank_in_mesh", lambda mesh: True)
    monkeypatch.setattr(mesh_mod, "group_name", lambda mesh, d=0: f"pg{d}")
    monkeypatch.setattr(mesh_mod, "process_group", lambda name: name)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda pg: "cpu:gloo,cuda:nccl")
    assert mesh_mod.process_group_backend(FakeMesh("cpu")) == "gloo"
    assert mesh_mod.process_group_backend(FakeMesh("cuda")) == "nccl"
    # Dims on different backends: unknown, so the default profile.
    monkeypatch.setattr(dist, "get_backend", lambda pg: {"pg0": "gloo", "pg1": "nccl"}[pg])
    assert mesh_mod.process_group_backend(FakeMesh("cpu")) is None
    # torchtitan's meshes: dims of degree 1 (and dims it never communicates over) are
    # "fake" groups, which move no data; the dims that do carry collectives decide.
    backends = {"pg0": "fake", "pg1": "fake", "pg2": "gloo", "pg3": "gloo"}
    monkeypatch.setattr(dist, "get_backend", lambda pg: backends[pg])
    assert mesh_mod.process_group_backend(FakeMesh("cpu", (1, 1, 2, 2))) == "gloo"
    assert mesh_mod.process_group_backend(FakeMesh("cpu", (1, 2, 2, 2))) == "gloo"
    backends.update(pg2="fake", pg3="fake")
    assert mesh_mod.process_group_backend(FakeMesh("cpu", (1, 1, 2, 2))) == "fake"


def test_a_pass_the_profile_measured_slower_in_steps_is_left_out_by_default(no_env):
    # The norm weights' fold: P,P -> R,S(0) as one all_reduce over both dims (a group exists).
    spec = redist_opt.MeshSpec((2, 2), ("a", "b"), flattened=[("a", "b")], backend="gloo")
    p = redist_opt.plan(spec, "P,P", "R,S(0)", shape=(256,))
    gloo = CostModel.profile("gloo")
    assert gloo.slower_in_steps == ("merge-reductions-into-all-reduce",)
    listed_nowhere = dataclasses.replace(gloo, slower_in_steps=())
    assert "merge-reductions-into-all-reduce" in redist_opt.optimize(p, cost=listed_nowhere).applied_passes
    default = redist_opt.optimize(p)  # the gloo profile, from the mesh's backend
    assert "merge-reductions-into-all-reduce" not in default.applied_passes
    assert default.num_collectives == 2
    # prefer="consistency" asks for the fewest collectives whatever the time; a pass list
    # the caller chose runs as given
    assert redist_opt.optimize(p, prefer="consistency").num_collectives == 1
    assert redist_opt.optimize(p, passes=[MergeReductionsIntoAllReduce]).num_collectives == 1
