"""Calibration where the job runs: the launcher's environment, the backend/device/clock
choice (the CUDA branch selected with the probe overridden, never run), the per-kind
fit, and ``redist-opt calibrate`` started as the ranks of a launched job on gloo."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from support.paths import ROOT

from redist_opt.ir.cost import KINDS, CostModel
from redist_opt.ir.cost_fit import fit_per_kind, fit_profile
from redist_opt.ir.mesh import MeshSpec
from redist_opt.tools import timing
from redist_opt.tools.calibrate import Launch, default_mesh, launched
from redist_opt.tools.cli import main
from redist_opt.tools.spawn import free_port

# -- the launcher's environment -----------------------------------------------------------------


def test_not_launched_without_rank_env():
    assert launched({}) is None
    assert launched({"RANK": "0"}) is None  # WORLD_SIZE missing: not a launch


def test_launch_read_from_torchrun_env():
    one_host = launched({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    assert one_host == Launch(rank=3, world=4, local_rank=3, local_world=4)
    assert one_host.devices_per_host is None  # one host: every group is intra-host
    two_hosts = launched({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert two_hosts.devices_per_host == 4
    # A launcher that sets only RANK/WORLD_SIZE: one host of WORLD_SIZE ranks.
    assert launched({"RANK": "1", "WORLD_SIZE": "2"}) == Launch(1, 2, 1, 2)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "x", "WORLD_SIZE": "4"}, "must be integers"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 WORLD_SIZE=4"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2"),
    ],
)
def test_bad_launch_env_is_named(env, message):
    with pytest.raises(ValueError, match=message):
        launched(env)


# -- backend, device and clock --------------------------------------------------------------------


class _FakeEvent:
    """Stands in for torch.Event: records a fake device time, counts synchronizes."""

    now = 0.0
    synced = 0

    def record(self):
        self.t = _FakeEvent.now

    def synchronize(self):
        _FakeEvent.synced += 1

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3  # milliseconds, like CUDA events


def _accelerator(monkeypatch, kind: str | None) -> None:
    """torch.accelerator reports an accelerator of type ``kind`` (None: none), and device
    events are :class:`_FakeEvent`: the CUDA branch runs on a CPU-only machine without
    touching a device."""

    class Accelerator:
        type = kind

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: kind is not None)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: Accelerator())
    monkeypatch.setattr(torch, "Event", lambda device=None, enable_timing=False: _FakeEvent())


def test_cpu_selects_gloo_and_the_wall_clock(monkeypatch):
    _accelerator(monkeypatch, None)
    backend, clock = timing.select_device(0)
    assert (backend, clock.device) == ("gloo", torch.device("cpu"))
    token = clock.start()
    assert isinstance(token, float) and clock.stop(token) >= 0.0  # the host clock: no event made


def test_cuda_selects_nccl_on_the_local_device_with_event_timing(monkeypatch):
    _accelerator(monkeypatch, "cuda")
    backend, clock = timing.select_device(3)
    assert (backend, clock.device) == ("nccl", torch.device("cuda", 3))
    token = clock.start()
    _FakeEvent.now += 0.25
    synced = _FakeEvent.synced
    assert clock.stop(token) == pytest.approx(0.25)
    assert _FakeEvent.synced == synced + 1  # the end event is waited for before reading


def test_probe_uses_torch_accelerator(monkeypatch):
    _accelerator(monkeypatch, "cuda")
    assert timing.select_device(1)[0] == "nccl"
    _accelerator(monkeypatch, "mps")
    assert timing.select_device(1)[0] == "gloo"  # not CUDA: no NCCL
    _accelerator(monkeypatch, None)
    assert timing.select_device(0)[0] == "gloo"


# -- fitting per collective kind and group size ------------------------------------------------


def _line(kind, p, link, a, b, sizes=(1024, 65536, 1 << 20)):
    return [dict(kind=kind, p=p, link=link, nbytes=n, time=a + b * n) for n in sizes]


def test_fit_per_kind_recovers_each_line():
    ms = (
        _line("all_reduce", 2, "intra", 1e-3, 2e-9)
        + _line("all_reduce", 8, "intra", 1.5e-3, 5e-9)
        + _line("all_gather", 4, "inter", 4e-4, 1e-8)
        + _line("all_to_all", 2, "intra", 1e-4, 1e-9, sizes=(1024,))
    )
    rows = fit_per_kind(ms)
    assert {r[:3] for r in rows} == {
        ("all_reduce", 2, "intra"),
        ("all_reduce", 8, "intra"),
        ("all_gather", 4, "inter"),
    }
    model = CostModel(fitted=rows)
    for m in ms[:9]:  # every point of the curves with 2+ sizes is reproduced
        assert model.time_of(m["kind"], m["p"], m["link"], m["nbytes"]) == pytest.approx(m["time"], rel=1e-9)
    # Between and beyond the measured sizes: the line through the neighbours.
    assert model.time_of("all_reduce", 8, "intra", 4 << 20) == pytest.approx(
        1.5e-3 + 5e-9 * (4 << 20), rel=1e-9
    )


def test_fit_per_kind_keeps_small_sizes_off_the_large_line():
    """A scalar all_reduce that is much cheaper than the line through the larger sizes
    (gloo on 8 ranks) keeps its own segment; a dip between sizes is treated as noise."""
    ms = [
        dict(kind="all_reduce", p=8, link="intra", nbytes=n, time=t)
        for n, t in ((4, 0.010), (1024, 0.028), (4096, 0.026), (65536, 0.030))
    ]
    model = CostModel(fitted=fit_per_kind(ms))
    assert model.time_of("all_reduce", 8, "intra", 4) == pytest.approx(0.010)
    assert model.time_of("all_reduce", 8, "intra", 1024) == pytest.approx(
        model.time_of("all_reduce", 8, "intra", 4096)
    )
    assert model.time_of("all_reduce", 8, "intra", 1024) == pytest.approx(0.027)
    assert model.time_of("all_reduce", 8, "intra", 65536) == pytest.approx(0.030)


def test_fitted_terms_price_measured_collectives_and_fall_back_elsewhere():
    model = dataclasses.replace(CostModel.profile("gloo"), fitted=())  # the alpha-beta terms alone
    fitted = CostModel(**{**model.to_dict(), "fitted": (("all_reduce", 8, "intra", 1 << 20, 1e-3, 1e-9),)})
    spec = MeshSpec(sizes=(2, 2, 2), names=("a", "b", "c"))
    world, one = spec.group((0, 1, 2)), spec.group((0,))
    assert fitted.collective_time("all_reduce", world, 1000, spec) == pytest.approx(1e-3 + 1e-6)
    # The one measured group size of a kind prices that kind's other sizes too.
    assert fitted.collective_time("all_reduce", one, 1000, spec) == pytest.approx(1e-3 + 1e-6)
    # A kind not measured: the shared alpha-beta terms, exactly as without the table.
    assert fitted.collective_time("all_gather", world, 1000, spec) == model.collective_time(
        "all_gather", world, 1000, spec
    )
    # Inter-host groups look up their own rows.
    multi = CostModel(**{**fitted.to_dict(), "devices_per_host": 4})
    assert multi.link(world, spec) == "inter" and multi.link(spec.group((2,)), spec) == "intra"
    assert multi.collective_time("all_reduce", world, 1000, spec) != pytest.approx(1e-3 + 1e-6)


def test_fitted_round_trips_through_json_and_stays_hashable(tmp_path):
    model = CostModel(
        fitted=(("all_reduce", 2, "intra", 1024, 1e-4, 1e-9), ("all_to_all", 4, "inter", 64, 2e-4, 3e-9))
    )
    path = tmp_path / "p.json"
    model.save(path)
    assert json.loads(path.read_text())["model"]["fitted"][1] == ["all_to_all", 4, "inter", 64, 2e-4, 3e-9]
    loaded = CostModel.load(path)
    assert loaded == model and hash(loaded) == hash(model)


@pytest.mark.parametrize(
    "rows, message",
    [
        ("x", "must be a list"),
        ([["all_reduce", 2, "intra", 1e-4]], "must be \\[kind"),
        ([["broadcast", 2, "intra", 64, 1e-4, 1e-9]], "unknown collective kind 'broadcast'"),
        ([["all_reduce", 2, "rack", 64, 1e-4, 1e-9]], "link 'rack'"),
        ([["all_reduce", 2, "intra", 64, -1, 1e-9]], ">= 0"),
        ([["all_reduce", 2.5, "intra", 64, 1e-4, 1e-9]], "integer"),
    ],
)
def test_bad_fitted_rows_are_named(rows, message):
    with pytest.raises(ValueError, match=message):
        CostModel.from_dict({"fitted": rows})


def test_fit_profile_fits_inter_host_terms_when_measured():
    ms = []
    for kind in KINDS:
        ms += _line(kind, 2, "intra", 1e-4, 1e-9) + _line(kind, 4, "intra", 2e-4, 2e-9)
        ms += _line(kind, 2, "inter", 1e-3, 1e-8)
    model, record = fit_profile(ms, [0.01, 0.02, 0.03], "t", devices_per_host=2)
    assert model.devices_per_host == 2 and model.create_group == 0.02
    assert "inter" in record and model.bw_inter < model.bw_intra
    assert len({r[:3] for r in model.fitted}) == 3 * len(KINDS)
    assert all(m["model"] == pytest.approx(m["time"], rel=1e-6) for m in ms)
    one_host, rec = fit_profile([m for m in ms if m["link"] == "intra"], [0.01], "t")
    assert one_host.devices_per_host is None and "inter" not in rec


# -- the command under a launcher ----------------------------------------------------------------


def _launch_env(rank: int, world: int, local_world: int, port: int) -> dict:
    env = dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % local_world),
        LOCAL_WORLD_SIZE=str(local_world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def test_launched_rank_count_mismatch_is_a_usage_error(monkeypatch, capsys):
    for k, v in _launch_env(0, 4, 4, 1).items():
        monkeypatch.setenv(k, v)
    assert main(["calibrate", "--mesh", "2x3"]) == 2
    assert "WORLD_SIZE is 4" in capsys.readouterr().err


@pytest.mark.slow
def test_launched_calibrate_on_two_hosts_of_two_ranks(tmp_path):
    """4 ranks launched as 2 hosts x 2 (LOCAL_WORLD_SIZE=2): gloo on CPU, the host and
    cross-host groups measured, only rank 0 writes, and the profile loads."""
    out = tmp_path / "p.json"
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "redist_opt",
        "calibrate",
        "--mesh",
        "2x2",
        "--sizes",
        "1KiB,16KiB",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--out",
        str(out),
    ]
    procs = [
        subprocess.Popen(
            args,
            cwd=tmp_path,
            env=_launch_env(r, 4, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(4)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert "wrote" in outputs[0] and all("wrote" not in o for o in outputs[1:])
    assert sorted(os.listdir(tmp_path)) == ["p.json"]
    model = CostModel.load(out)
    cal = json.loads(out.read_text())["calibration"]
    assert (cal["mode"], cal["backend"], cal["device"], cal["devices_per_host"]) == (
        "launched",
        "gloo",
        "cpu",
        2,
    )
    assert model.devices_per_host == 2
    # calibration measures collectives alone: the in-step decisions of the gloo profile are kept, and said so
    assert model.slower_in_steps == CostModel.profile("gloo").slower_in_steps != ()
    assert "built-in 'gloo' profile" in cal["slower_in_steps_from"]
    assert "rewrites left out as slower inside training steps" in outputs[0]
    groups = {(m["group"], m["p"], m["link"]) for m in cal["measurements"]}
    # dim d1 (stride 1) stays on a host, d0 and the whole mesh span both.
    assert groups == {
        ("d0", 2, "inter"),
        ("d1", 2, "intra"),
        ("d0+d1", 4, "inter"),
        ("host", 2, "intra"),
        ("hosts", 2, "inter"),
    }
    assert {r[:3] for r in model.fitted} == {(k, p, link) for k in KINDS for (_, p, link) in groups}


@pytest.mark.slow
def test_torchrun_calibrate_writes_a_profile_bench_loads(tmp_path):
    """The documented line, on 4 ranks: ``torchrun --nproc_per_node=4 -m redist_opt calibrate``
    measures the world as 2x2 (groups of 2 and of 4) without being told a mesh."""
    out = tmp_path / "p.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=4",
            "--master_port",
            str(free_port()),
            "-m",
            "redist_opt",
            "calibrate",
            "--sizes",
            "1KiB,16KiB",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = CostModel.load(out)
    cal = json.loads(out.read_text())["calibration"]
    assert cal["mesh"]["sizes"] == [2, 2] and cal["nprocs"] == 4 and model.devices_per_host is None
    assert {r[1] for r in model.fitted} == {2, 4}
    assert main(["bench", "--part", "planning", "--plan-runs", "2", "--profile", str(out)]) == 0


@pytest.mark.parametrize(
    "world, mesh",
    [
        (2, (2,)),
        (3, (3,)),
        (4, (2, 2)),
        (6, (2, 3)),
        (8, (2, 2, 2)),
        (16, (2, 2, 4)),
        (12, (2, 2, 3)),
        (1, (1,)),
    ],
)
def test_default_mesh_of_a_launched_world_measures_several_group_sizes(world, mesh):
    assert default_mesh(world) == mesh


def test_unmeasured_group_sizes_interpolate_between_measured_curves():
    rows = fit_per_kind(
        _line("all_reduce", 2, "intra", 1e-3, 0.0) + _line("all_reduce", 8, "intra", 4e-3, 0.0)
    )
    model = CostModel(fitted=rows)
    assert model.time_of("all_reduce", 4, "intra", 1024) == pytest.approx(2e-3)  # between 2 and 8
    assert model.time_of("all_reduce", 14, "intra", 1024) == pytest.approx(7e-3)  # past 8: the same slope
    # A kind never measured on that link: the alpha-beta formula.
    assert model.time_of("all_gather", 4, "intra", 1024) == CostModel().time_of(
        "all_gather", 4, "intra", 1024
    )


def test_builtin_gloo_is_measured_and_gloo_ring_is_the_textbook_model():
    gloo, ring = CostModel.profile("gloo"), CostModel.profile("gloo-ring")
    assert gloo.fitted and not ring.fitted and ring.algorithm == "ring"
    spec = MeshSpec(sizes=(2, 2, 2), names=("a", "b", "c"))
    world, pairs = spec.group((0, 1, 2)), [spec.group((d,)) for d in range(3)]
    # The loss reduction: one scalar all_reduce over 8 ranks against three over pairs.
    merged = gloo.collective_time("all_reduce", world, 4, spec)
    assert merged < sum(gloo.collective_time("all_reduce", g, 4, spec) for g in pairs)
    assert ring.collective_time("all_reduce", world, 4, spec) > sum(
        ring.collective_time("all_reduce", g, 4, spec) for g in pairs
    )
