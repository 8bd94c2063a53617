"""Decision accuracy of a cost profile: ``python -m benchmarks.decisions [--profile P ...]``.

A profile is trusted for what it decides: between two plans of one redistribution,
which one is faster. This module collects the alternatives the pipeline chooses
between, runs each on live gloo process groups and counts how often the profile's
choice was the measured faster one.

* Cases: the 8-rank cases of the quality corpus (``redist_opt/tools/corpus.json``)
  plus a few on 2x2x2 and 2x4 meshes, each scaled to a few global sizes (tiny to medium, float32).
* Alternatives of a case: torch's plan with its merge pass off (separate collectives),
  torch 2.13's shipped merges (``ir.torch_merge``), and the pipeline's result under
  the nccl and gloo profiles and every profile being judged, with and without the
  collective cap, and with ``prefer="consistency"`` (every reduction merged). Plans
  issuing the same collectives (kind, group, bytes, in order) are one alternative.
  So a pair is a choice the pipeline made somewhere: merged vs separate, a fat
  all_reduce vs reduce_scatter + all_reduce, one order vs another, ours vs torch's.
* Measurement: every alternative of a case runs interleaved on 8 gloo ranks
  (``tools.timing``: slowest rank per sample, median over samples, standard error from
  the MAD). A pair's measured difference is beyond noise when it exceeds 3 combined
  standard errors and 5% of the slower time.
* Accuracy of a profile: among the pairs beyond noise (where the profile models the
  two as different), the fraction where the plan it models faster was measured faster.
  One measurement judges any number of profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

import redist_opt
from redist_opt.ir.cost import CostModel
from redist_opt.ir.torch_merge import torch_merged_plan
from redist_opt.runtime.execute import execute
from redist_opt.tools.args import CliError, cost_model, mesh_spec
from redist_opt.tools.corpus import load_corpus
from redist_opt.tools.spawn import run_ranks
from redist_opt.tools.timing import Stat, timed_samples

__all__ = [
    "DecisionCase",
    "decision_cases",
    "alternatives",
    "measure_decisions",
    "judge",
    "format_decisions",
    "told_apart",
]

RANKS = 8
# Global bytes each case is scaled to: small enough that launches dominate, large
# enough that bytes do.
DEFAULT_TARGETS = (4 << 10, 512 << 10)
# A measured difference counts when above this many combined standard errors and this fraction.
NOISE_SIGMAS = 3.0
MIN_RATIO = 0.05

# Cases beyond the corpus on the 8-rank meshes of torchtitan-style jobs (no flattened
# groups but the world: merges there need groups="create" or the world group).
EXTRA_CASES = (
    ("dp=2,cp=2,tp=2", (), "P,P,P", "R,R,R", (1024, 256)),
    ("dp=2,cp=2,tp=2", (), "P,P,S(1)", "S(0),R,S(1)", (1024, 256)),
    ("dp=2,cp=2,tp=2", ("dp+cp",), "P(avg),P(avg),S(1)", "S(0),S(0),S(1)", (1024, 256)),
    ("dp=2,cp=2,tp=2", ("dp+cp",), "S(0),S(0),S(1)", "R,R,S(1)", (1024, 256)),
    ("dp=2,cp=2,tp=2", (), "S(0),S(1),R", "S(1),S(0),R", (512, 512)),
    ("dp=2,tp=4", (), "P,P", "S(0),R", (1024, 256)),
    ("dp=2,tp=4", (), "P,P", "R,R", (1024, 256)),
    ("dp=2,tp=4", (), "S(0),S(1)", "R,R", (1024, 256)),
)


@dataclasses.dataclass(frozen=True)
class DecisionCase:
    id: str
    mesh: str  # name=size,...
    flatten: tuple[str, ...]
    src: str
    dst: str
    shape: tuple[int, ...]

    def spec(self) -> redist_opt.MeshSpec:
        return mesh_spec(self.mesh, list(self.flatten))


def _scaled(shape: Sequence[int], target: int, itemsize: int = 4) -> tuple[int, ...]:
    """``shape`` with its largest dims halved until it holds at most ``target`` bytes."""
    shape = list(shape)
    while shape and math.prod(shape) * itemsize > target:
        d = max(range(len(shape)), key=lambda i: shape[i])
        shape[d] = max(1, shape[d] // 2)
    return tuple(shape)


def decision_cases(corpus: str | None = None, targets: Sequence[int] = DEFAULT_TARGETS) -> list[DecisionCase]:
    """The corpus's 8-rank cases and the extra ones, each at every target size (scalars once)."""
    raw = [
        (c.id, c.mesh, tuple(c.flatten), c.src, c.dst, tuple(c.shape))
        for c in load_corpus(corpus)
        if c.spec().num_ranks == RANKS
    ]
    raw += [
        (f"{m}:{s}->{d}" + (f"[{'+'.join(f)}]" if f else ""), m, f, s, d, sh)
        for m, f, s, d, sh in EXTRA_CASES
    ]
    out, seen = [], set()
    for cid, mesh, flatten, src, dst, shape in raw:
        for target in targets:
            scaled = _scaled(shape, target)
            key = (mesh, flatten, src, dst, scaled)
            if key not in seen:
                seen.add(key)
                out.append(DecisionCase(f"{cid}@{math.prod(scaled) * 4}B", mesh, flatten, src, dst, scaled))
    return out


def _signature(p) -> tuple:
    return tuple((c.kind, c.group.dims, c.bytes_in) for c in p.collectives())


def alternatives(case: DecisionCase, profiles: Sequence[CostModel]) -> list[tuple[str, object]]:
    """(label, plan) of every distinct plan the pipeline or torch chooses for the case;
    [] when there is no choice (one plan) or the case is not planned."""
    try:
        naive = redist_opt.plan(case.spec(), case.src, case.dst, shape=case.shape)
    except Exception:
        return []
    if naive.fallback:
        return []
    found = [("torch-nomerge", naive), ("torch", torch_merged_plan(naive))]
    models = [CostModel.profile("gloo"), CostModel.profile("nccl"), *profiles]
    for model in dict.fromkeys(models):
        for groups, cap in itertools.product(("existing", "create"), ("torch", "any")):
            p = redist_opt.optimize(naive, groups=groups, cost=model, max_collectives=cap)
            found.append((f"{model.name}/{groups}/{cap}", p))
    found.append(
        (
            "consistency",
            redist_opt.optimize(naive, groups="create", prefer="consistency", max_collectives="any"),
        )
    )
    distinct: dict[tuple, tuple[str, object]] = {}
    for label, p in found:
        distinct.setdefault(_signature(p), (label, p))
    return list(distinct.values()) if len(distinct) > 1 else []


def _local_input(mesh, case: DecisionCase, rank: int) -> torch.Tensor:
    src = redist_opt.parse_placements(case.src)
    torch.manual_seed(0)
    full = torch.randn(case.shape)
    dt = distribute_tensor(
        full, mesh, [Replicate() if p.is_partial() else p for p in src], src_data_rank=None
    )
    if any(p.is_partial() for p in src):
        dt = DTensor.from_local(
            dt.to_local() * (rank + 1), mesh, src, run_check=False, shape=full.shape, stride=full.stride()
        )
    return dt.to_local()


def _decisions_worker(rank: int, world: int, cases, profile_dicts, iters: int, warmup: int) -> list:
    profiles = [CostModel.from_dict(d) for d in profile_dicts]
    meshes: dict = {}
    rows = []
    for case in cases:
        spec = case.spec()
        key = (case.mesh, case.flatten)
        if key not in meshes:
            mesh = init_device_mesh("cpu", spec.sizes, mesh_dim_names=spec.names)
            for f in case.flatten:
                mesh[tuple(f.split("+"))]._flatten()
            meshes[key] = mesh
        mesh = meshes[key]
        alts = alternatives(case, profiles)
        if not alts:
            continue
        x = _local_input(mesh, case, rank)
        fns = [lambda g=p.graph, x=x, mesh=mesh: execute(g, x, mesh, groups="create") for _, p in alts]
        outs = [f() for f in fns]
        equal = all(
            o.shape == outs[0].shape and torch.allclose(o, outs[0], rtol=1e-4, atol=1e-4) for o in outs
        )
        samples = timed_samples(fns, iters, warmup)
        rows.append(
            {"id": case.id, "labels": [label for label, _ in alts], "equal": equal, "samples": samples}
        )
    return rows


def measure_decisions(
    cases: Sequence[DecisionCase],
    profiles: Sequence[CostModel] = (),
    *,
    iters: int = 9,
    warmup: int = 2,
    timeout: float = 900.0,
) -> dict:
    """Run every case's alternatives on 8 gloo ranks: per case, per alternative, the
    measured Stat and the plan's collectives."""
    t0 = time.perf_counter()
    per_rank = run_ranks(
        _decisions_worker,
        RANKS,
        (list(cases), [p.to_dict() for p in profiles], iters, warmup),
        timeout=timeout,
    )
    by_id = {c.id: c for c in cases}
    out = []
    for i, r0 in enumerate(per_rank[0]):
        case = by_id[r0["id"]]
        alts = dict(alternatives(case, profiles))
        stats = [Stat.of([r[i]["samples"][k] for r in per_rank]) for k in range(len(r0["labels"]))]
        out.append(
            {
                "case": dataclasses.asdict(case),
                "equal": all(r[i]["equal"] for r in per_rank),
                "alternatives": [
                    {"label": label, "plan": alts[label], "median_s": s.median, "stderr_s": s.stderr}
                    for label, s in zip(r0["labels"], stats)
                ],
            }
        )
    return {"ranks": RANKS, "iters": iters, "wall_s": time.perf_counter() - t0, "cases": out}


def _ops(p) -> str:
    short = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A"}
    return " ".join(f"{short[c.kind]}({c.group.name(p.mesh)})" for c in p.collectives()) or "(local)"


def judge(measured: dict, model: CostModel) -> dict:
    """Every pair of alternatives of every case under ``model``: modelled and measured
    times, the model's pick, whether the measured difference is beyond noise, and
    whether the pick was right; then accuracy = right / (beyond noise, model not tied)."""
    pairs = []
    for case in measured["cases"]:
        for a, b in itertools.combinations(case["alternatives"], 2):
            ma, mb = model.plan_time(a["plan"]), model.plan_time(b["plan"])
            ta, tb = a["median_s"], b["median_s"]
            noise = NOISE_SIGMAS * math.hypot(a["stderr_s"], b["stderr_s"])
            beyond = abs(ta - tb) > max(noise, MIN_RATIO * max(ta, tb))
            tied = math.isclose(ma, mb, rel_tol=1e-9)
            pick = None if tied else ("a" if ma < mb else "b")
            faster = "a" if ta < tb else "b"
            pairs.append(
                {
                    "case": case["case"]["id"],
                    "a": a["label"],
                    "b": b["label"],
                    "a_ops": _ops(a["plan"]),
                    "b_ops": _ops(b["plan"]),
                    "model_a_s": ma,
                    "model_b_s": mb,
                    "measured_a_s": ta,
                    "measured_b_s": tb,
                    "stderr_a_s": a["stderr_s"],
                    "stderr_b_s": b["stderr_s"],
                    "noise_s": noise,
                    "beyond_noise": beyond,
                    "model_pick": pick,
                    "measured_faster": faster,
                    "correct": None if pick is None or not beyond else pick == faster,
                }
            )
    judged = [p for p in pairs if p["correct"] is not None]
    right = sum(p["correct"] for p in judged)
    return {
        "profile": model.name,
        "pairs": pairs,
        "judged": len(judged),
        "correct": right,
        "beyond_noise": sum(p["beyond_noise"] for p in pairs),
        "model_ties": sum(p["model_pick"] is None for p in pairs),
        "accuracy": right / len(judged) if judged else float("nan"),
    }


def _column_label(profile: str) -> str:
    """At most 14 characters: a profile told apart by its file shows the file."""
    if len(profile) > 14 and profile.endswith(")") and " (" in profile:
        profile = profile.rsplit(" (", 1)[1][:-1]
    return profile[:14]


def format_decisions(verdicts: Sequence[dict], measured: dict, *, all_pairs: bool = False) -> str:
    lines = [
        f"decision accuracy: {len(measured['cases'])} cases with 2+ alternatives on {measured['ranks']} gloo "
        f"ranks, median of {measured['iters']} samples (slowest rank); measured in {measured['wall_s']:.0f} s"
    ]
    for v in verdicts:
        lines.append(
            f"  profile {v['profile']}: {v['correct']}/{v['judged']} = "
            f"{v['accuracy'] * 100:.0f}% of pairs beyond "
            "noise the model picks the measured faster one "
            f"({len(v['pairs'])} pairs, {v['beyond_noise']} beyond "
            f"noise, {v['model_ties']} modelled equal)"
        )
    lines.append("")
    head = (
        f"{'case':<44} {'alternative a':<26} {'alternative b':<26} "
        f"{'meas a ms':>10} {'meas b ms':>10} {'noise':>6}"
    )
    head += "".join(f" {_column_label(v['profile']):>14}" for v in verdicts)
    lines.append(head)
    first = verdicts[0]["pairs"] if verdicts else []
    for i, p in enumerate(first):
        if not (all_pairs or p["beyond_noise"]):
            continue
        row = (
            f"{p['case'][:44]:<44} {p['a_ops'][:26]:<26} {p['b_ops'][:26]:<26} "
            f"{p['measured_a_s'] * 1e3:>10.3f} {p['measured_b_s'] * 1e3:>10.3f} {p['noise_s'] * 1e3:>6.3f}"
        )
        for v in verdicts:
            q = v["pairs"][i]
            mark = {True: "ok", False: "WRONG", None: "tie" if q["model_pick"] is None else "noise"}[
                q["correct"]
            ]
            row += f" {q['model_a_s'] * 1e3:>5.2f}/{q['model_b_s'] * 1e3:<5.2f}{mark:>3}"[:15].rjust(15)
        lines.append(row)
    lines.append(
        f"pairs shown: measured difference > max({NOISE_SIGMAS:g} combined standard errors, "
        f"{MIN_RATIO:.0%}); per profile: modelled ms a/b and whether its pick was the measured faster"
    )
    return "\n".join(lines)


def _json_ready(measured: dict, verdicts: Sequence[dict]) -> dict:
    cases = [
        {
            **c,
            "alternatives": [
                {k: v for k, v in a.items() if k != "plan"} | {"ops": _ops(a["plan"])}
                for a in c["alternatives"]
            ],
        }
        for c in measured["cases"]
    ]
    return {**measured, "cases": cases, "verdicts": list(verdicts)}


def told_apart(models: Sequence[CostModel], sources: Sequence[str]) -> list[CostModel]:
    """``models`` with the profiles that share a name (two files calibrated on 4 ranks
    are both ``gloo-calibrated-4``) renamed after the file (or name) they came from."""
    names = [m.name for m in models]
    return [
        m if names.count(m.name) == 1 else dataclasses.replace(m, name=f"{m.name} ({os.path.basename(src)})")
        for m, src in zip(models, sources)
    ]


def cmd_decisions(args) -> int:
    """``python -m benchmarks.decisions``: exit 0, 1 when the alternatives' results disagree."""
    names = args.profile or ["gloo"]
    models = told_apart([cost_model("--profile", n, None)[0] for n in names], names)
    cases = decision_cases(args.corpus)
    print(
        f"decision accuracy: {len(cases)} cases (corpus 8-rank cases and 2x2x2 / 2x4 extras at "
        f"{', '.join(str(t) for t in DEFAULT_TARGETS)} bytes), profiles {', '.join(m.name for m in models)}; "
        f"8 gloo ranks ...",
        flush=True,
    )
    measured = measure_decisions(
        cases, models, iters=args.iters, warmup=args.warmup, timeout=max(args.timeout, 900)
    )
    verdicts = [judge(measured, m) for m in models]
    print(format_decisions(verdicts, measured))
    if not all(c["equal"] for c in measured["cases"]):
        bad = [c["case"]["id"] for c in measured["cases"] if not c["equal"]]
        print(f"MISMATCH: alternatives disagree on {bad}")
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_json_ready(measured, verdicts), f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decisions", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--profile",
        action="append",
        help="a profile to judge (nccl, gloo, gloo-ring or a JSON file from `redist-opt calibrate`; "
        "repeatable; default gloo)",
    )
    parser.add_argument(
        "--corpus", default=None, metavar="FILE", help="a corpus JSON (default: the shipped one)"
    )
    parser.add_argument("--iters", type=int, default=7, help="timed samples per alternative (default 7)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed calls per alternative first (default 2)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before giving up on the ranks")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    try:
        return cmd_decisions(args)
    except CliError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
