"""One rank of the autoparallel check: autoparallel's example ``Block`` planned,
applied and (on gloo) run, with and without redist_opt.

autoparallel (github.com/meta-pytorch/autoparallel; the package of that name on
PyPI is unrelated) is imported here only, inside functions: this module loads
without it. Its example script runs a 256-rank CUDA job at import, so the
``Block`` model (and the checkpoint policy it uses) is taken out of
``examples/example_autoparallel.py`` by its syntax tree: the classes, functions
and ``context_fn`` are executed, the script's top-level run is not.

Five builds of the same model on the same mesh (one ILP solution each; the
solver is deterministic, and the runner checks that the builds of one ILP pricing
placed the parameters the same way):

- ``torch``: autoparallel as shipped (its compiler, torch's redistribute);
- ``pass``: ``compiler_fn`` only: the graph pass on the graphs autoparallel traced;
- ``enabled``: ``compiler_fn`` and ``enabled()`` around the ``AutoParallel``
  block: autoparallel's by-name binding of ``redistribute_local_tensor`` is routed
  (calls counted). autoparallel lowers its graph inside torch's
  ``use_min_cost_redistribution_plan()``; with default shard orders redist_opt plans
  those calls too (the flag only picks between torch's own two planners).
- ``priced``: autoparallel as shipped, but its ILP prices its edges with
  :func:`redist_opt.redistribute_cost` (the modelled time of redist_opt's plan on
  the mesh's groups) instead of its own copy of torch's estimate, so it may place
  parameters differently (recorded, and its values compared with ``torch``'s: that
  difference is autoparallel's own, between two placements);
- ``costs``: ``priced``'s ILP with ``enabled`` and ``compiler_fn``; its values are
  compared with ``priced``'s (the same placement, torch's redistribute).

Each graph autoparallel compiles (training forward, training backward, inference
forward) is counted before and after the pass, with the pass's reasons for what it
kept. On gloo, one training step and one inference forward run on each build with
the same weights and inputs; outputs and gradients are compared with ``torch``'s.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

from redist_opt.api import routing
from redist_opt.api.costs import redistribute_cost
from redist_opt.graph_pass import compiler_fn, count_collectives

__all__ = ["BlockDims", "BUILDS", "REFERENCE", "example_path", "load_block", "cpu_device_limit", "check_rank"]

BUILDS = ("torch", "pass", "enabled", "priced", "costs")
# the build each one's values are compared with
REFERENCE = {"pass": "torch", "enabled": "torch", "priced": "torch", "costs": "priced"}

EXAMPLE_ENV = "REDIST_OPT_AUTOPARALLEL_EXAMPLE"
EXAMPLE_MODULE = "autoparallel_example_block"  # the module Block is loaded as


@dataclasses.dataclass(frozen=True)
class BlockDims:
    """The example's sizes (its defaults: batch 8 per dp rank, seq 256, 48 heads, dim 6144, bf16)."""

    batch: int = 8  # per dp rank
    seq: int = 256
    nheads: int = 48
    dim: int = 6144
    hidden_mult: int = 4
    dtype: str = "bfloat16"  # the parameters' dtype (autoparallel's MixedPrecisionPolicy); float32: none


def example_path() -> Path:
    """``examples/example_autoparallel.py`` of the autoparallel checkout (an editable
    install), or the file ``$REDIST_OPT_AUTOPARALLEL_EXAMPLE`` names."""
    if os.environ.get(EXAMPLE_ENV):
        return Path(os.environ[EXAMPLE_ENV])
    spec = importlib.util.find_spec("autoparallel")  # found, not imported (importing it takes seconds)
    if spec is None or spec.origin is None:
        raise ImportError("No module named 'autoparallel'")
    return Path(spec.origin).resolve().parents[1] / "examples" / "example_autoparallel.py"


def load_block(path: Path):
    """The ``Block`` class of autoparallel's example, without running the script."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))

    def keep(node) -> bool:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoparallel"):
            return False  # the example's own entry points; Block does not use them
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)):
            return True
        return isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "context_fn" for t in node.targets
        )

    body = [node for node in tree.body if keep(node)]
    # A module in sys.modules: Dynamo, tracing Block.forward, imports its globals' module by name.
    module = types.ModuleType(EXAMPLE_MODULE)
    module.__file__ = str(path)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    if not hasattr(module, "Block"):
        raise LookupError(f"{path} defines no Block class")
    sys.modules[EXAMPLE_MODULE] = module
    return module.Block


@contextlib.contextmanager
def cpu_device_limit(name: str = "H100"):
    """autoparallel's compute cost model reads the GPU's name (``torch.cpu`` has no
    ``get_device_name``); within the block it prices compute as on ``name`` (the
    example's target). Only autoparallel's module attribute is replaced, and put back."""
    from autoparallel.cost_models import compute_estimation

    limit = next(d for d in compute_estimation.DEVICE_LIMITS if d.name == name)
    previous = compute_estimation._get_device_limit
    compute_estimation._get_device_limit = lambda: limit
    try:
        yield
    finally:
        compute_estimation._get_device_limit = previous


def _graph_label(gm, kwargs) -> str:
    if kwargs.get("tag_forward"):
        return "training forward"  # autoparallel's fw_compiler is partial(compiler_fn, tag_forward=True)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return "training backward" if any(n.startswith("tangents") for n in names) else "inference forward"


class GraphLog:
    """A compiler around another: each graph's label and collectives before and after it."""

    def __init__(self, compiler, pass_results: list | None):
        self.compiler, self.pass_results = compiler, pass_results
        self.graphs: list[dict] = []

    def __call__(self, gm, example_inputs, **kwargs):
        before = count_collectives(gm)
        compiled = self.compiler(gm, example_inputs, **kwargs)
        entry = {"graph": _graph_label(gm, kwargs), "before": before, "after": count_collectives(gm)}
        if self.pass_results is not None:
            result = self.pass_results[-1]
            entry["pass"] = _pass_summary(result)
        self.graphs.append(entry)
        return compiled


def _pass_summary(result) -> dict:
    if result is None:
        return {"failed": True, "rewritten": [], "kept": []}
    return {
        "failed": False,
        "rewritten": [str(c) for c in result.chains if c.rewritten],
        "kept": [str(c) for c in result.chains if not c.rewritten] + [str(n) for n in result.not_raised],
    }


class RoutedCalls:
    """Counts the redistributions that reach redist_opt's routed function, and
    whether autoparallel's by-name binding was replaced by it (and restored)."""

    def __init__(self):
        self.calls = 0
        self.torch_only: dict[str, int] = {}
        self.binding_routed = False

    def __call__(self, local_tensor, current_spec, target_spec, reason) -> None:
        self.calls += 1
        if reason is not None:
            self.torch_only[reason] = self.torch_only.get(reason, 0) + 1

    @contextlib.contextmanager
    def active(self, groups: str):
        from autoparallel.shardings import ordered_sharding

        with routing.enabled(groups):
            self.binding_routed = (
                ordered_sharding.redistribute_local_tensor is routing.routed_redistribute_local_tensor
            )
            routing.OBSERVERS.append(self)
            try:
                yield self
            finally:
                routing.OBSERVERS.remove(self)
        if ordered_sharding.redistribute_local_tensor is routing.routed_redistribute_local_tensor:
            raise AssertionError("enabled() left autoparallel's binding routed after the block")


def _build(block_cls, mesh, dims: BlockDims, build: str, groups: str):
    """The parallel module of one build, its GraphLog and RoutedCalls (or None)."""
    from autoparallel.api import AutoParallel
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    with torch.device("meta"):
        model = block_cls(dims.nheads, dims.dim, dims.dim * dims.hidden_mult)
    dtype = getattr(torch, dims.dtype)
    mp = (
        None
        if dtype == torch.float32
        else MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    )

    def input_fn():
        return torch.rand(dims.batch * mesh.shape[0], dims.seq, dims.dim)

    routed = RoutedCalls() if build in ("enabled", "costs") else None
    costs = _our_costs(groups) if build in ("priced", "costs") else contextlib.nullcontext()
    with routed.active(groups) if routed else contextlib.nullcontext(), costs:
        with AutoParallel(model, input_fn, mesh, mp) as autop:  # entering it prices the edges
            autop.add_parameter_memory_constraint(low=None, high=None)
            io = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
            autop.add_input_constraints([io])
            autop.add_output_constraints([io])
            placement = autop.optimize_placement()
            if build in ("torch", "priced"):
                log = GraphLog(autop.compiler_fn, None)
            else:
                ours = compiler_fn(meshes=mesh, groups=groups, inner=autop.compiler_fn)
                log = GraphLog(ours, ours.results)
            autop.compiler_fn = log
            parallel = autop.apply_placement(placement)
    return parallel, log, routed


@contextlib.contextmanager
def _our_costs(groups: str):
    """autoparallel's ILP edge costs from :func:`redist_opt.redistribute_cost` (the line
    a user writes: ``optimize_sharding.estimate_strategy_comms_cost = ...``)."""
    from autoparallel import optimize_sharding

    own = optimize_sharding.estimate_strategy_comms_cost
    optimize_sharding.estimate_strategy_comms_cost = lambda src, tgt: redistribute_cost(
        src, tgt, groups=groups
    )
    try:
        yield
    finally:
        optimize_sharding.estimate_strategy_comms_cost = own


def _placements(module) -> dict:
    return {name: str(tuple(p.placements)) for name, p in module.named_parameters()}


def _seeded(seed: int, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g).to(dtype)


def _step(module, reference, mesh, dims: BlockDims) -> dict:
    """One training step and one inference forward; the weights are ``reference``'s
    (or this module's own, seeded, for the reference itself). Inputs depend on the
    dp coordinate only (they are replicated over tp)."""
    module.to_empty(device="cpu")
    if reference is None:
        torch.manual_seed(0)
        module.init_weights()
    else:
        weights = dict(reference.named_parameters())
        with torch.no_grad():
            for name, p in module.named_parameters():
                w = weights[name]  # the same on every rank: redistributed where placed differently
                p.to_local().copy_(w.redistribute(p.device_mesh, p.placements).to_local())
    dp = mesh.get_coordinate()[0]
    x = _seeded(1000 + dp, (dims.batch, dims.seq, dims.dim), torch.float32)
    out = module(x)
    grad_out = _seeded(2000 + dp, out.shape, out.dtype)
    out.backward(grad_out)
    with torch.no_grad():
        inference = module(x)
    # whole gradients: a build may have placed a parameter differently
    grads = {name: p.grad.full_tensor().detach().clone() for name, p in module.named_parameters()}
    return {"out": out.detach().clone(), "inference": inference.detach().clone(), "grads": grads}


def _compare(ref: dict, got: dict) -> dict:
    pairs = [("output", ref["out"], got["out"]), ("inference output", ref["inference"], got["inference"])]
    pairs += [(f"grad {n}", ref["grads"][n], got["grads"][n]) for n in ref["grads"]]
    diffs = {what: (a.float() - b.float()).abs().max().item() for what, a, b in pairs}
    # relative to the largest magnitude of the reference (the outputs run to 1e8 with seeded weights)
    rel = {what: diffs[what] / max(a.float().abs().max().item(), 1e-30) for what, a, _ in pairs}
    return {
        "bitwise": all(torch.equal(a, b) for _, a, b in pairs),
        "max_abs_diff": max(diffs.values()),
        "max_rel_diff": max(rel.values()),
        "diffs": diffs,
    }


def check_rank(
    rank: int, world: int, mesh_shape: tuple, dims: BlockDims, groups: str, run_step: bool
) -> dict:
    """One rank: the three builds, their graphs, and (``run_step``) their values compared."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=("dp", "tp")[: len(mesh_shape)])
    block_cls = load_block(example_path())
    out: dict = {"rank": rank, "world": world, "builds": {}}
    values: dict = {}
    placements = None
    with cpu_device_limit():
        for build in BUILDS:
            parallel, log, routed = _build(block_cls, mesh, dims, build, groups)
            entry = {"graphs": log.graphs}
            if placements is None:
                placements = _placements(parallel)
            elif build == "priced":
                entry["placements"] = _placements(parallel)
            elif _placements(parallel) != out["builds"]["priced" if build == "costs" else "torch"].get(
                "placements", placements
            ):
                raise AssertionError(f"build {build!r} placed the parameters differently from its reference")
            if routed is not None:
                entry.update(
                    routed_calls=routed.calls,
                    torch_only=routed.torch_only,
                    binding_routed=routed.binding_routed,
                )
            if run_step:
                values[build] = _step(parallel, values.get("torch", {}).get("module"), mesh, dims)
                values[build]["module"] = parallel
                if build != "torch":
                    entry["compare"] = _compare(values[REFERENCE[build]], values[build])
            out["builds"][build] = entry
    out["placements"] = placements
    if dist.is_initialized():
        out["backend"] = dist.get_backend()
    return out
