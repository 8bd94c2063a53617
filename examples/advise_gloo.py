"""Record, advise, follow the advice: a TP + data-parallel step on real gloo ranks.

``python examples/advise_gloo.py [--nprocs 8] [--profile nccl] [--out DIR]`` runs, on every rank
of a torchtitan-style mesh (a 1-D world mesh ``_unflatten``ed into dp, cp, tp: no
flattened groups), two SGD steps of a 2-layer MLP, column- then row-parallel over tp,
data-parallel over dp and cp (the batch is sharded over them, the gradients are
reduced by redistributing them to the parameters' placements):

1. torch alone (its merge pass on; it finds no group to merge with);
2. under ``redist_opt.record()`` (step 1; ``enabled()`` for step 2): every rank's
   record is merged on rank 0, which runs ``advise(max_new_groups=1)`` with the cost
   profile ``--profile`` (default ``nccl``: the gloo ranks stand in for the GPU job the
   advice is for; the report also shows the advice of the built-in gloo profile);
3. every rank runs the printed ``_flatten`` line(s) on its mesh;
4. under ``redist_opt.enabled(groups="existing")``, its step 1 recorded again, so
   rank 0 also models torch with the new group (``advise(0)``'s "torch" column);
5. torch alone again: its merge pass now finds the new group (the advice's
   "torch 2.13 alone, advised groups" column).

Collectives per step are counted twice, by ``CommDebugMode`` and by a c10d dispatch
counter (:class:`~benchmarks.step_bench.wire.WireCounter`), on every rank. The
report compares them with the advice's prediction, and the losses of every run.
``--out DIR`` keeps the merged recording (``step.json``) and the advice as text,
JSON and SVG, so ``redist-opt advise DIR/step.json --profile nccl`` reproduces it.

This file is a user's script, not part of the package: its model and step live
outside redist_opt, so the recorded call sites name its lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import redist_opt
from redist_opt.api.recording import Recording
from redist_opt.debug.svg import write_text
from redist_opt.ir.cost import PROFILE_ENV, CostModel
from redist_opt.tools.spawn import run_ranks

# The c10d collective counter is the step bench's, in this checkout's benchmarks/ folder.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_bench.wire import WireCounter  # noqa: E402

__all__ = ["build_mesh", "MLP", "run", "predicted", "per_step", "loss_agreement", "format_report", "main"]

DIM, HIDDEN, BATCH, STEPS, LR = 16, 32, 32, 2, 0.1
MESH_NAMES = ("dp", "cp", "tp")


def build_mesh(world: int):
    """torchtitan's way: a 1-D world mesh, ``_unflatten``ed into (dp, cp, tp)."""
    tp = world // 4
    root = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    return root._unflatten(0, (2, 2, tp), MESH_NAMES)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


# Over tp: fc1 column-parallel, fc2 row-parallel (its bias replicated); over dp, cp: replicated.
TP_PLACEMENTS = {
    "fc1.weight": Shard(0),
    "fc1.bias": Shard(0),
    "fc2.weight": Shard(1),
    "fc2.bias": Replicate(),
}


def make_model_and_batch(mesh):
    """The same parameters and batch on every rank (seeded; no communication)."""
    torch.manual_seed(0)
    model = MLP()
    for name, p in list(model.named_parameters()):
        owner, attr = name.rsplit(".", 1)
        placements = [Replicate(), Replicate(), TP_PLACEMENTS[name]]
        dt = distribute_tensor(p.detach(), mesh, placements, src_data_rank=None)
        model.get_submodule(owner).register_parameter(attr, torch.nn.Parameter(dt))
    data = [Shard(0), Shard(0), Replicate()]
    x = distribute_tensor(torch.randn(BATCH, DIM), mesh, data, src_data_rank=None)
    target = distribute_tensor(torch.randn(BATCH, DIM), mesh, data, src_data_rank=None)
    return model, x, target


def train_step(model, mesh, x, target, opt) -> float:
    """Forward, loss, backward, gradients reduced over dp and cp, SGD update."""
    loss = ((model(x) - target) ** 2).mean().full_tensor()
    loss.backward()
    for p in model.parameters():
        p.grad = p.grad.redistribute(mesh, p.placements)
    opt.step()
    opt.zero_grad()
    return loss.item()


def _run_steps(mesh, contexts) -> dict:
    """One step per context manager factory; collectives counted per step."""
    model, x, target = make_model_and_batch(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = {"losses": [], "comm_debug": [], "wire": [], "wire_by_kind": [], "records": []}
    for make in contexts:
        with make() as ctx, CommDebugMode() as cdm, WireCounter() as wire:
            out["losses"].append(train_step(model, mesh, x, target, opt))
        if isinstance(ctx, Recording):
            out["records"].append(ctx.to_dict())
        out["comm_debug"].append(cdm.get_total_counts())
        out["wire"].append(len(wire.calls))
        kinds = {}
        for c in wire.calls:
            kinds[f"{c.kind}@{c.group_size}"] = kinds.get(f"{c.kind}@{c.group_size}", 0) + 1
        out["wire_by_kind"].append(dict(sorted(kinds.items())))
    # plain lists: a result must pickle back to the parent (no autograd history)
    out["final_params"] = [p.full_tensor().detach().flatten().tolist() for p in model.parameters()]
    return out


def _merged_on_rank0(record: dict) -> Recording | None:
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(record, gathered, dst=0)
    return Recording.merge(gathered) if gathered is not None else None


def _rank(rank: int, world: int, max_new_groups: int, profile: str) -> dict:
    # CommDebugMode's module hooks warn that no input requires grad: true, and no news
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    # The runs plan with the profile the advice prices them with (the gloo ranks stand
    # in for the job the advice is for), so the prediction is of the plans that run.
    os.environ[PROFILE_ENV] = profile
    mesh = build_mesh(world)
    runs = {"torch": _run_steps(mesh, [contextlib.nullcontext] * STEPS)}
    runs["existing"] = _run_steps(mesh, [redist_opt.record] + [redist_opt.enabled] * (STEPS - 1))
    rec = _merged_on_rank0(runs["existing"]["records"][0])
    cost = CostModel.profile(profile)
    advice = rec.advise(max_new_groups, cost=cost, cost_source=f"--profile {profile}") if rank == 0 else None
    lines = [advice.flatten_lines if rank == 0 else None]
    dist.broadcast_object_list(lines, src=0)
    for line in lines[0]:
        exec(line, {"mesh": mesh})  # what the user pastes after building the mesh
    follow = lambda: redist_opt.record(groups="existing")  # noqa: E731
    runs["advised"] = _run_steps(
        mesh, [follow] + [lambda: redist_opt.enabled(groups="existing")] * (STEPS - 1)
    )
    after = _merged_on_rank0(runs["advised"]["records"][0])
    runs["torch_with_group"] = _run_steps(mesh, [contextlib.nullcontext] * STEPS)
    out = {"rank": rank, "flatten_lines": lines[0]}
    for name, r in runs.items():
        out[name] = {k: v for k, v in r.items() if k != "records"}
    if rank == 0:
        out["profile"] = profile
        out["recording"] = rec.to_dict()
        out["advice"] = advice.to_dict()
        out["advice_text"] = str(advice)
        out["advice_svg"] = advice.to_svg()
        out["torch_with_group_modelled"] = after.advise(0, cost=cost).to_dict()["total"]["torch"]
        out["gloo_profile_advice"] = rec.advise(max_new_groups, cost=CostModel.profile("gloo")).to_dict()
    return out


def run(
    nprocs: int = 8, max_new_groups: int = 1, profile: str = "nccl", timeout: float = 900.0
) -> list[dict]:
    """Every rank's results (rank 0's also hold the recording and the advice)."""
    if nprocs % 4 or nprocs < 4:
        raise ValueError(
            f"nprocs={nprocs}: the mesh is 2 x 2 x (nprocs / 4), so nprocs must be a multiple of 4"
        )
    return run_ranks(_rank, nprocs, (max_new_groups, profile), timeout=timeout)


# (run, heading, the advice's total it is predicted by)
RUNS = (
    ("torch", "torch alone (its merge pass on), no new group", ("total", "torch")),
    ("existing", "redist_opt, existing groups (recorded)", ("total", "existing")),
    ("advised", "redist_opt, after the advised _flatten", ("total", "advised")),
    ("torch_with_group", "torch alone, after the advised _flatten", ("total", "torch_advised")),
)


def predicted(results: list[dict], run_name: str) -> int:
    """The collectives per step the advice predicts for ``run_name``."""
    head = results[0]
    key = dict((r, p) for r, _, p in RUNS)[run_name][1]
    return head["advice"]["total"][key]["collectives"]


def per_step(results: list[dict], run_name: str, counter: str) -> list[int]:
    """``counter``'s collectives per step (every step) when every rank agrees; else raises."""
    seen = {tuple(r[run_name][counter]) for r in results}
    if len(seen) != 1:
        raise AssertionError(
            f"{run_name}: ranks count different collectives per step ({counter}): {sorted(seen)}"
        )
    return list(seen.pop())


def loss_agreement(results: list[dict]) -> dict:
    """Losses per run (rank 0) and their largest relative difference from torch's."""
    ref = results[0]["torch"]["losses"]
    out = {"bitwise": True, "max_rel_diff": 0.0, "losses": {}}
    for run_name, _, _ in RUNS:
        losses = results[0][run_name]["losses"]
        out["losses"][run_name] = losses
        for a, b in zip(losses, ref):
            out["bitwise"] &= a == b
            out["max_rel_diff"] = max(out["max_rel_diff"], abs(a - b) / max(abs(b), 1e-30))
    ref_params = [x for p in results[0]["torch"]["final_params"] for x in p]
    out["params_max_abs_diff"] = max(
        abs(a - b)
        for n, _, _ in RUNS
        for a, b in zip((x for p in results[0][n]["final_params"] for x in p), ref_params)
    )
    for r in results:  # every rank reads the same (replicated) loss
        out["bitwise"] &= all(r[n]["losses"] == results[0][n]["losses"] for n, _, _ in RUNS)
    return out


def format_report(results: list[dict]) -> str:
    head = results[0]
    mesh = head["recording"]["meshes"][0]
    lines = [
        f"{len(results)} gloo ranks; mesh {'x'.join(map(str, mesh['sizes']))} {tuple(mesh['names'])} "
        f"= {mesh['root']['names'][0]}._unflatten(...), flattened groups: {len(mesh['flattened'])}; "
        f"MLP {DIM}-{HIDDEN}-{DIM}, batch {BATCH}, {STEPS} SGD steps, float32",
        "",
        f"advice with the {head['profile']} profile (rank 0, the merged record of every rank's first step):",
    ]
    lines += ["  " + x for x in head["advice_text"].rstrip().splitlines()]
    gloo = head["gloo_profile_advice"]
    lines += [
        "",
        f"with the built-in gloo profile instead: {len(gloo['groups'])} group(s) "
        f"{[g['code'] for g in gloo['groups']]}; modelled step "
        + ", ".join(
            f"{k} {gloo['total'][k]['time_s'] * 1e6:.0f} us" for k in ("torch", "existing", "advised")
        ),
    ]
    lines += ["", "collectives per step (the same on every rank and every step):"]
    rows = [["run", "predicted", "CommDebugMode", "c10d wire", "wire by kind"]]
    for name, heading, _ in RUNS:
        kinds = ", ".join(f"{k} x{n}" for k, n in head[name]["wire_by_kind"][0].items())
        rows.append(
            [
                heading,
                str(predicted(results, name)),
                str(per_step(results, name, "comm_debug")[0]),
                str(per_step(results, name, "wire")[0]),
                kinds,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    agree = loss_agreement(results)
    lines += ["", "losses per step (rank 0):"]
    for name, heading, _ in RUNS:
        lines.append(f"  {heading:<44} {' '.join(repr(x) for x in agree['losses'][name])}")
    same = "bitwise equal" if agree["bitwise"] else f"max relative difference {agree['max_rel_diff']:.2e}"
    lines.append(
        f"  losses across runs and ranks: {same}; parameters after {STEPS} steps: "
        f"max abs difference from torch's {agree['params_max_abs_diff']:.2e}"
    )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python examples/advise_gloo.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=8, help="gloo ranks, a multiple of 4 (default 8)")
    p.add_argument(
        "--max-new-groups", type=int, default=1, help="advise at most this many groups (default 1)"
    )
    p.add_argument("--profile", default="nccl", choices=("nccl", "gloo"), help="cost profile to advise with")
    p.add_argument("--out", help="folder for step.json and advice.{txt,json,svg}")
    args = p.parse_args(argv)
    results = run(args.nprocs, args.max_new_groups, args.profile)
    report = format_report(results)
    print(report, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Recording.from_dict(results[0]["recording"]).save(os.path.join(args.out, "step.json"))
        write_text(os.path.join(args.out, "advice.txt"), results[0]["advice_text"])
        write_text(os.path.join(args.out, "advice.json"), json.dumps(results[0]["advice"], indent=1) + "\n")
        write_text(os.path.join(args.out, "advice.svg"), results[0]["advice_svg"])
        write_text(os.path.join(args.out, "report.txt"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
