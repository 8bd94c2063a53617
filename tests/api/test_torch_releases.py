"""What moves between torch releases and must not reach redist_opt's outputs, checked on
whichever torch is installed.

* Under LocalTensorMode torch 2.15 patches ``dist.get_rank()`` to return a SymInt holding
  every simulated rank's value: no record, dump file name or file holds one (rank reads go
  through ``torch_api.dtensor.process_rank``, a plain int).
* ``import redist_opt`` and a routed call emit no FutureWarning (torch 2.15 deprecates
  names 2.13 had, e.g. ``torch.distributed.config.compile_on_one_rank``).
* ``redist_opt.redistribute`` returns the dtype torch's ``DTensor.redistribute`` returns where
  the local redistribution changes it (LocalTensorMode's reduce_scatter "avg" of integers
  returns float32): torch 2.13 casts it back, 2.11 and 2.12 keep it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
from support.meshes import ensure_fake_pg
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import redist_opt
from redist_opt.debug import dump
from redist_opt.torch_api import dtensor as tdt


def _ints_only(value, where="record"):
    """Every number in a JSON-like value is a plain int, float or bool (no SymInt)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _ints_only(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _ints_only(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (int, float, bool, str), f"{where}: {type(value).__name__}"


def test_no_symint_reaches_a_record_a_dump_name_or_a_file(tmp_path, monkeypatch):
    ensure_fake_pg()
    rank = dist.group.WORLD.rank()
    monkeypatch.setenv(dump.DUMP_DIR_ENV, str(tmp_path / "dumps"))
    monkeypatch.setenv(dump.DUMP_PASSES_ENV, "")
    redist_opt.clear_caches()  # plan afresh, so the pipeline dumps
    with LocalTensorMode(4):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("u", "w"))
        assert type(tdt.process_rank()) is int and tdt.process_rank() == rank
        assert dump.rank_suffix() == f".rank{rank}"
        dt = distribute_tensor(torch.arange(24.0).reshape(6, 4), mesh, [Shard(0), Replicate()])
        with redist_opt.record() as rec:
            x = dt.redistribute(mesh, [Replicate(), Shard(1)])
            x.redistribute(mesh, [Shard(1), Shard(0)]).redistribute(mesh, [Replicate(), Replicate()])
    assert rec.ranks == [rank] and all(type(r) is int for r in rec.ranks)
    path = tmp_path / "step.json"
    rec.save(path)  # json.dump raised TypeError on a SymInt
    data = json.loads(path.read_text())
    _ints_only(data)
    assert data["ranks"] == [rank]
    names = [p.name for p in (tmp_path / "dumps").rglob("*") if p.is_file()]
    assert names and all(f".rank{rank}." in n for n in names), names


def test_import_and_a_routed_call_emit_no_future_warning():
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("error", FutureWarning)
        import torch, torch.distributed as dist
        import redist_opt
        from torch.distributed._local_tensor import LocalTensorMode
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        dist.init_process_group("fake", rank=0, world_size=4)
        with LocalTensorMode(4) as lm:
            mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("a", "b"))
            local = lm.rank_map(lambda r: torch.full((4, 4), float(r)))
            dt = DTensor.from_local(local, mesh, [Partial(), Partial()], run_check=False)
            with redist_opt.enabled():
                for _ in range(2):  # planned, then cached
                    dt.redistribute(mesh, [Replicate(), Shard(0)])
            redist_opt.redistribute(dt, [Shard(0), Replicate()])
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_integer_avg_reduce_scatter_returns_the_dtype_torch_returns():
    ensure_fake_pg()
    with LocalTensorMode(4) as lm:
        mesh = DeviceMesh("cpu", torch.arange(4), mesh_dim_names=("a",))
        local = lm.rank_map(lambda r: torch.arange(8, dtype=torch.int64).reshape(4, 2) + 7 * r)
        dt = DTensor.from_local(local, mesh, [Partial("avg")], run_check=False)
        ref = dt.redistribute(mesh, [Shard(0)])
        ours = redist_opt.redistribute(dt, [Shard(0)])
        with redist_opt.enabled():
            routed = dt.redistribute(mesh, [Shard(0)])
    # the avg over the 4 ranks is x + 10.5: a float32 result torch 2.13 truncates back to int64
    assert ref.dtype == (torch.int64 if tdt.REDISTRIBUTE_CASTS_OUTPUT else torch.float32)
    for out in (ours, routed):
        assert out.dtype == ref.dtype
        assert out.to_local().dtype == ref.to_local().dtype
        for r in range(4):
            assert torch.equal(out.to_local()._local_tensors[r], ref.to_local()._local_tensors[r])
