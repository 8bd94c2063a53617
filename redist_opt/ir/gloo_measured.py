"""The built-in ``gloo`` profile's measured curves: `redist-opt calibrate` under
``torchrun --nproc_per_node=8 -m redist_opt calibrate --mesh 2x2x2 --iters 9``
on the development machine (2 cpus, load average [41.02, 43.56, 40.18], torch 2.13.0+cpu,
2026-11-22T22:43:49+00:00).

Rows are ``CostModel.fitted``: (kind, group size, link, up_to_nbytes, per_call_s, per_byte_s),
4 significant digits. On an oversubscribed CPU every collective costs milliseconds of
scheduling whatever its size, so one merged collective beats two smaller ones up to
hundreds of KiB, and a scalar all_reduce over 8 ranks costs about what one over 2 does;
what the plans are chosen by is these ratios, not the absolute times.
"""

ALPHA_BETA = {
    "launch": 0.00213,
    "alpha": 0.001851,
    "bw": 204800000.0,
    "algorithm": "ring",
    "create_group": 0.04229,
}

FITTED = (
    ("all_gather", 2, "intra", 64, 0.006471, 0.0),
    ("all_gather", 2, "intra", 1024, 0.006471, 0.0),
    ("all_gather", 2, "intra", 4096, 0.006471, 0.0),
    ("all_gather", 2, "intra", 16384, 0.006471, 0.0),
    ("all_gather", 2, "intra", 65536, 0.006375, 5.851e-09),
    ("all_gather", 2, "intra", 262144, 0.006488, 4.135e-09),
    ("all_gather", 2, "intra", 1048576, 0.006181, 5.304e-09),
    ("all_gather", 2, "intra", 4611686018427387904, 0.006356, 5.137e-09),
    ("all_gather", 4, "intra", 64, 0.01267, 0.0),
    ("all_gather", 4, "intra", 1024, 0.01267, 0.0),
    ("all_gather", 4, "intra", 4096, 0.01267, 0.0),
    ("all_gather", 4, "intra", 16384, 0.01267, 0.0),
    ("all_gather", 4, "intra", 65536, 0.01189, 4.73e-08),
    ("all_gather", 4, "intra", 262144, 0.01392, 1.646e-08),
    ("all_gather", 4, "intra", 1048576, 0.01364, 1.751e-08),
    ("all_gather", 4, "intra", 4611686018427387904, 0.0138, 1.736e-08),
    ("all_gather", 8, "intra", 64, 0.02543, 0.0),
    ("all_gather", 8, "intra", 1024, 0.02543, 0.0),
    ("all_gather", 8, "intra", 4096, 0.02543, 0.0),
    ("all_gather", 8, "intra", 16384, 0.02543, 0.0),
    ("all_gather", 8, "intra", 65536, 0.02501, 2.595e-08),
    ("all_gather", 8, "intra", 262144, 0.02189, 7.352e-08),
    ("all_gather", 8, "intra", 1048576, 0.03179, 3.574e-08),
    ("all_gather", 8, "intra", 4611686018427387904, 0.02613, 4.113e-08),
    ("all_reduce", 2, "intra", 64, 0.007094, 0.0),
    ("all_reduce", 2, "intra", 1024, 0.007094, 0.0),
    ("all_reduce", 2, "intra", 4096, 0.00685, 2.382e-07),
    ("all_reduce", 2, "intra", 16384, 0.007825, 0.0),
    ("all_reduce", 2, "intra", 65536, 0.007825, 0.0),
    ("all_reduce", 2, "intra", 262144, 0.007825, 0.0),
    ("all_reduce", 2, "intra", 1048576, 0.006662, 4.437e-09),
    ("all_reduce", 2, "intra", 4611686018427387904, 0.007327, 3.803e-09),
    ("all_reduce", 4, "intra", 64, 0.009648, 7.254e-05),
    ("all_reduce", 4, "intra", 1024, 0.01429, 0.0),
    ("all_reduce", 4, "intra", 4096, 0.01417, 1.178e-07),
    ("all_reduce", 4, "intra", 16384, 0.01376, 2.187e-07),
    ("all_reduce", 4, "intra", 65536, 0.01689, 2.752e-08),
    ("all_reduce", 4, "intra", 262144, 0.01839, 4.676e-09),
    ("all_reduce", 4, "intra", 1048576, 0.01784, 6.743e-09),
    ("all_reduce", 4, "intra", 4611686018427387904, 0.01815, 6.448e-09),
    ("all_reduce", 8, "intra", 64, 0.009438, 0.0003681),
    ("all_reduce", 8, "intra", 1024, 0.033, 0.0),
    ("all_reduce", 8, "intra", 4096, 0.033, 0.0),
    ("all_reduce", 8, "intra", 16384, 0.03278, 5.46e-08),
    ("all_reduce", 8, "intra", 65536, 0.03335, 1.98e-08),
    ("all_reduce", 8, "intra", 262144, 0.0339, 1.132e-08),
    ("all_reduce", 8, "intra", 1048576, 0.03433, 9.68e-09),
    ("all_reduce", 8, "intra", 4611686018427387904, 0.03409, 9.914e-09),
    ("all_to_all", 2, "intra", 64, 0.005784, 0.0),
    ("all_to_all", 2, "intra", 1024, 0.005784, 0.0),
    ("all_to_all", 2, "intra", 4096, 0.005784, 0.0),
    ("all_to_all", 2, "intra", 16384, 0.005784, 0.0),
    ("all_to_all", 2, "intra", 65536, 0.005722, 3.817e-09),
    ("all_to_all", 2, "intra", 262144, 0.005846, 1.918e-09),
    ("all_to_all", 2, "intra", 1048576, 0.005762, 2.241e-09),
    ("all_to_all", 2, "intra", 4611686018427387904, 0.00581, 2.195e-09),
    ("all_to_all", 4, "intra", 64, 0.00911, 0.0),
    ("all_to_all", 4, "intra", 1024, 0.00911, 0.0),
    ("all_to_all", 4, "intra", 4096, 0.00911, 0.0),
    ("all_to_all", 4, "intra", 16384, 0.00911, 0.0),
    ("all_to_all", 4, "intra", 65536, 0.008595, 3.146e-08),
    ("all_to_all", 4, "intra", 262144, 0.01008, 8.772e-09),
    ("all_to_all", 4, "intra", 1048576, 0.01238, 0.0),
    ("all_to_all", 4, "intra", 4611686018427387904, 0.01107, 1.253e-09),
    ("all_to_all", 8, "intra", 64, 0.01579, 0.0),
    ("all_to_all", 8, "intra", 1024, 0.01579, 0.0),
    ("all_to_all", 8, "intra", 4096, 0.01574, 4.702e-08),
    ("all_to_all", 8, "intra", 16384, 0.01593, 0.0),
    ("all_to_all", 8, "intra", 65536, 0.01593, 0.0),
    ("all_to_all", 8, "intra", 262144, 0.01555, 5.844e-09),
    ("all_to_all", 8, "intra", 1048576, 0.01509, 7.597e-09),
    ("all_to_all", 8, "intra", 4611686018427387904, 0.01535, 7.347e-09),
    ("reduce_scatter", 2, "intra", 64, 0.007615, 0.0),
    ("reduce_scatter", 2, "intra", 1024, 0.007615, 0.0),
    ("reduce_scatter", 2, "intra", 4096, 0.007615, 0.0),
    ("reduce_scatter", 2, "intra", 16384, 0.007271, 8.392e-08),
    ("reduce_scatter", 2, "intra", 65536, 0.008646, 0.0),
    ("reduce_scatter", 2, "intra", 262144, 0.008542, 1.588e-09),
    ("reduce_scatter", 2, "intra", 1048576, 0.007646, 5.005e-09),
    ("reduce_scatter", 2, "intra", 4611686018427387904, 0.008158, 4.517e-09),
    ("reduce_scatter", 4, "intra", 64, 0.01136, 6.498e-05),
    ("reduce_scatter", 4, "intra", 1024, 0.01552, 0.0),
    ("reduce_scatter", 4, "intra", 4096, 0.01552, 0.0),
    ("reduce_scatter", 4, "intra", 16384, 0.01438, 2.767e-07),
    ("reduce_scatter", 4, "intra", 65536, 0.01887, 2.875e-09),
    ("reduce_scatter", 4, "intra", 262144, 0.01904, 3.076e-10),
    ("reduce_scatter", 4, "intra", 1048576, 0.0167, 9.233e-09),
    ("reduce_scatter", 4, "intra", 4611686018427387904, 0.01803, 7.958e-09),
    ("reduce_scatter", 8, "intra", 64, 0.01241, 0.0003326),
    ("reduce_scatter", 8, "intra", 1024, 0.0337, 0.0),
    ("reduce_scatter", 8, "intra", 4096, 0.0337, 0.0),
    ("reduce_scatter", 8, "intra", 16384, 0.03312, 1.401e-07),
    ("reduce_scatter", 8, "intra", 65536, 0.0352, 1.319e-08),
    ("reduce_scatter", 8, "intra", 262144, 0.03607, 0.0),
    ("reduce_scatter", 8, "intra", 1048576, 0.03149, 1.744e-08),
    ("reduce_scatter", 8, "intra", 4611686018427387904, 0.03411, 1.495e-08),
)

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
