"""Multi-rank dumps carry the rank in every file name (``NNNN.<name>.rankR.<stage>``).

Run in a subprocess with the fake backend (rank 3 of 8), so torch.distributed is
initialized with world size > 1, as in a real multi-rank job; before it is
initialized names have no rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from redist_opt.debug import dump

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch, torch.distributed as dist, torch.fx as fx
    from redist_opt.debug import dump
    from redist_opt.graph_pass import optimize_graph
    from redist_opt.ir.mesh import MeshSpec
    from redist_opt.ir.placements import parse_placements
    from redist_opt.ir.plan import make_plan
    from redist_opt.pipeline import run_pipeline

    out = Path(sys.argv[1])
    assert dump.rank_suffix() == ""  # not initialized: no rank in names
    dist.init_process_group("fake", rank=3, world_size=8)
    assert dump.rank_suffix() == ".rank3"
    naive = make_plan(
        MeshSpec((2, 2)), parse_placements("P,P"), parse_placements("R,R"), (8, 4), torch.float32
    )
    run_pipeline(naive, on_change=dump.pass_dump_writer(out / "pipeline", naive))
    dump.write_pass_dump(out / "direct", 0, "default", None, naive)
    optimize_graph(fx.Graph())  # the graph pass's own dumps (REDIST_OPT_DUMP_DIR)
    print("OK")
""")


def test_every_dump_file_names_the_rank(tmp_path):
    env = {**os.environ, dump.DUMP_DIR_ENV: str(tmp_path / "graph"), dump.DUMP_PASSES_ENV: ""}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    names = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert names and all(".rank3." in n for n in names), names
    assert (tmp_path / "direct" / "0000.default.rank3.before_pipeline.txt").exists()
    assert any(n.startswith("0000.default_") and n.endswith(".rank3.before_pipeline.txt") for n in names), (
        names
    )
    assert {
        "0000.graph_pass.rank3.before.txt",
        "0000.graph_pass.rank3.after.txt",
        "0000.graph_pass.rank3.explain.txt",
    } <= set(names), names
