"""The built-in ``gloo`` profile's in-step decision: the passes whose rewrites made a
measured training step slower on gloo ranks (``CostModel.slower_in_steps`` of
``CostModel.profile("gloo")``).

A decision about passes, so it sits above them: the IR's cost model carries the names
and does not know the passes; :mod:`redist_opt.pipeline`, which runs them, declares this
tuple to :mod:`redist_opt.ir.cost` when it is imported. The block below is written by
``benchmarks/gloo_decision.py``, not edited by hand; the profile's measured curves are
``redist_opt/ir/gloo_measured.py``.
"""

# Passes whose rewrites made a training step slower on gloo ranks of the development machine,
# decided by the shipped tuning workflow (redist_opt.tune, docs/tune.md) inside the step bench's
# simplefsdp_tp 1x2x2 dim 1024 step (inductor), not edited by hand. Regenerate with:
#   python -m benchmarks.step_bench --wall --wall-compiler inductor --step-config
#       simplefsdp_tp:1x2x2:256 --step-config simplefsdp_tp:1x2x2:1024 --step-config
#       tp_classic:1x1x4:512 --rounds 30 --tune-rounds 10 --json /work/logs/wall213_final.json
#   python -m benchmarks.gloo_decision <that run's --json file> --config "simplefsdp_tp 1x2x2 dim 1024"
# (commit 3358b30, torch 2.13.0+cpu; 33 steps and 3 compiles in 59 s). Per rewrite: step without / with
# it, slowest rank per step, paired-bootstrap 95% interval, and the rule's decision
# (a measurement changes the base profile's decision only where it is confident):
#   merge-reductions-into-all-reduce: 0.886x [0.834, 1.021], dropped
SLOWER_IN_STEPS = ("merge-reductions-into-all-reduce",)
