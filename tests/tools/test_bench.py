"""`redist-opt calibrate` and `redist-opt bench` end to end, in a reduced mode.

These spawn real gloo processes (4 ranks on 127.0.0.1); they check exit codes and
the JSON the commands write, never how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.paths import ROOT

from redist_opt.ir.cost import KINDS, CostModel
from redist_opt.tools.bench import format_wall, planning_bench, wall_bench
from redist_opt.tools.cli import main
from redist_opt.tools.spawn import PORT_TRIES, SpawnError, on_a_free_port, run_ranks

pytestmark = pytest.mark.xdist_group("bench")  # the profile fixture calibrates on 4 gloo ranks


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "redist_opt.tools.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A profile from a reduced calibrate run (shared by the bench test)."""
    out = tmp_path_factory.mktemp("calibrate") / "profile.json"
    proc = run_cli(
        "calibrate",
        "--sizes",
        "1KiB,64KiB",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--out",
        str(out),
        "--timeout",
        "150",
    )
    return proc, out


@pytest.mark.slow  # calibrates on 4 gloo ranks
def test_calibrate_end_to_end(profile):
    proc, out = profile
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured ms" in proc.stdout and "modelled ms" in proc.stdout and "model / measured" in proc.stdout
    data = json.loads(out.read_text())
    model = CostModel.load(out)
    assert model.algorithm in ("ring", "tree")
    assert model.launch >= 0 and model.alpha_intra >= 0 and model.bw_intra > 0
    cal = data["calibration"]
    assert cal["nprocs"] == 4 and cal["mesh"]["sizes"] == [2, 2]
    # 4 collectives x (2 mesh dims + the flattened whole mesh) x 2 sizes.
    ms = cal["measurements"]
    assert len(ms) == len(KINDS) * 3 * 2
    assert {m["kind"] for m in ms} == set(KINDS)
    assert {(m["group"], m["p"]) for m in ms} == {("d0", 2), ("d1", 2), ("d0+d1", 4)}
    assert {m["nbytes"] for m in ms} == {1024, 65536}
    assert all(m["time"] > 0 and m["model"] > 0 for m in ms)
    assert set(cal["fit"]["rms_rel_error"]) == {"ring", "tree", "ring, rs=ar", "tree, rs=ar"}
    assert len(cal["group_creation_s"]) == 3


@pytest.mark.slow  # benchmarks on 4 gloo ranks
def test_bench_end_to_end(profile, tmp_path):
    proc, prof = profile
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "bench.json"
    proc = run_cli(
        "bench",
        "--sizes",
        "1KiB,64KiB",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--plan-runs",
        "3",
        "--case",
        "P,P->R,R",
        "--case",
        "S(0),S(1)->S(1),S(0)",
        "--profile",
        str(prof),
        "--json",
        str(out),
        "--timeout",
        "150",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ours/torch" in proc.stdout and "median us" in proc.stdout
    data = json.loads(out.read_text())
    planning = data["planning"]
    assert planning["case"]["ranks"] == 8 * 16 * 32 * 32
    assert planning["cost_profile_used"] is True
    assert {k for k in planning["timings"]} == {
        "plan uncached",
        "optimize uncached",
        "plan+optimize uncached",
        "plan cached",
        "plan+optimize cached",
        "redistribute hot path cached",
    }
    assert all(t["median_us"] > 0 for t in planning["timings"].values())
    rows = data["wall"]["rows"]
    assert [(r["case"], r["nbytes"]) for r in rows] == [
        ("P,P -> R,R", 1024),
        ("P,P -> R,R", 65536),
        ("S(0),S(1) -> S(1),S(0)", 1024),
        ("S(0),S(1) -> S(1),S(0)", 65536),
    ]
    for r in rows:
        assert r["equal"], r
        assert r["torch_ms"] > 0 and r["torch_nomerge_ms"] > 0 and r["ours_ms"] > 0
        assert len(r["samples_ms"]["ours"]) == 2
        assert isinstance(r["slower"], bool)
        # torch without its merge pass issues one collective per mesh dim.
        assert r["collectives"]["torch_nomerge"] == 2
    assert data["wall"]["cost_profile_used"] is True


@pytest.mark.slow  # 4 gloo ranks
def test_wall_bench_judges_our_result_and_flags_torchs_wrong_merge():
    """An uneven gather over the flattened a+b: torch 2.13's merged all_gather is wrong
    (pytorch PR 194457), ours is exact. The row says so and our result still counts as
    equal; the even twin carries no flag."""
    res = wall_bench(
        [("S(0),S(0)", "R,R", (5, 3)), ("S(0),S(0)", "R,R", (8, 3))], iters=1, warmup=0, timeout=150
    )
    uneven, even = res["rows"]
    assert (uneven["equal"], uneven["torch_equal"]) == (True, False)
    assert (even["equal"], even["torch_equal"]) == (True, True)
    assert uneven["collectives"] == even["collectives"] == {"torch": 1, "torch_nomerge": 2, "ours": 1}
    table = format_wall(res).splitlines()
    assert "torch WRONG" in table[2] and "torch WRONG" not in table[3]


def test_planning_bench_in_process():
    res = planning_bench(runs=2, cached_runs=5, cost=CostModel.profile("gloo"))
    assert res["collectives"] >= 1
    assert res["timings"]["plan cached"]["runs"] == 5


# -- argument errors: exit code 2, one line, nothing spawned ----------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["calibrate", "--sizes", "lots"], "size 'lots'"),
        (["calibrate", "--mesh", "1,1"], "nothing to measure"),
        (["bench", "--sizes", "4MiB..1KiB"], "is empty"),
        (["bench", "--case", "P,P"], "expected SRC->DST"),
        (["bench", "--case", "P->R"], "1 placements for a 2-D mesh"),
        (["bench", "--profile", "/nonexistent/profile.json"], "--profile"),
        (["bench", "--iters", "0"], "--iters"),
    ],
)
def test_usage_errors(argv, message, capsys):
    start = time.monotonic()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert time.monotonic() - start < 30


# -- spawning: failures and hangs come back as errors with the child's traceback ----------------


def _fail_on_rank_1(rank: int, world: int) -> int:
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("boom on rank one")
    dist.barrier()  # the others wait for rank 1 and must not hang the parent
    return rank


def _hang(rank: int, world: int, seconds: float) -> None:
    time.sleep(seconds)


def test_run_ranks_reports_child_traceback():
    start = time.monotonic()
    with pytest.raises(SpawnError) as e:
        run_ranks(_fail_on_rank_1, 2, timeout=120)
    msg = str(e.value)
    assert "rank 1 of 2 failed" in msg
    assert "Traceback" in msg and "RuntimeError: boom on rank one" in msg
    assert time.monotonic() - start < 100


@pytest.mark.slow  # waits for a 10 s timeout
def test_run_ranks_times_out():
    start = time.monotonic()
    with pytest.raises(SpawnError, match=r"ranks \[0, 1\] of 2 did not report within 10s"):
        run_ranks(_hang, 2, (600,), timeout=10)
    assert time.monotonic() - start < 60  # the hanging ranks were terminated, not waited for


def test_a_taken_port_is_retried_on_another_and_other_failures_are_not():
    ports = []

    def port_taken_once(port):
        ports.append(port)
        if len(ports) == 1:
            raise SpawnError(
                "rank 0 of 2 failed: DistNetworkError: ... failed to listen ... (errno: 98 - EADDRINUSE)"
            )
        return "ran"

    assert on_a_free_port(port_taken_once) == "ran" and len(ports) == 2

    def always_taken(port):
        ports.append(port)
        raise SpawnError("EADDRINUSE")

    ports.clear()
    with pytest.raises(SpawnError):
        on_a_free_port(always_taken)
    assert len(ports) == PORT_TRIES

    def boom(port):
        ports.append(port)
        raise SpawnError("rank 1 of 2 failed: boom")

    ports.clear()
    with pytest.raises(SpawnError, match="boom"):
        on_a_free_port(boom)
    assert len(ports) == 1
