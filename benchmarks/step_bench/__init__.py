"""``python -m benchmarks.step_bench``: real training steps of torchtitan's own code.

torchtitan 0.3.0's llama3 debug model, shrunk, parallelized by torchtitan's own
functions (FSDP2 + TP, SimpleFSDP + TP, full DTensor, classic TP) on its
``ParallelDims`` meshes over 4 or 8 gloo ranks; loss parallel, ``clip_grad_norm_``
and AdamW. Each mode (plain torch, ``enabled(groups=...)``, compiled against
``redist_opt.backend``) reports collectives on the wire, bytes, wall, every loss,
and what redist_opt routed or handed back; ``--wall`` times torch's step against
ours, interleaved, with intervals. Runs from a checkout; needs the ``frameworks`` extra.
"""

from benchmarks.step_bench import report
from benchmarks.step_bench.runner import (
    CONFIGS,
    INSTALL_HINT,
    MODES,
    add_step_arguments,
    cmd_step,
    parse_config,
    run_step_bench,
    torchtitan_missing,
)

__all__ = [
    "CONFIGS",
    "INSTALL_HINT",
    "MODES",
    "add_step_arguments",
    "cmd_step",
    "parse_config",
    "report",
    "run_step_bench",
    "torchtitan_missing",
]
