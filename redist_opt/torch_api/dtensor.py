"""The one module that touches DTensor's private planner and spec classes.

``DTensorSpec``, ``TensorMeta``, ``redistribute_local_tensor``,
``_gen_transform_infos_non_cached`` and ``disable_redistribute_transform_optimization``
are private to ``torch.distributed.tensor``, and so are a DTensor's ``_spec`` and
``_local_tensor`` and LocalTensorMode's per-rank values
(``torch.distributed._local_tensor``); a torch upgrade that changes them should
only need this file updated (mesh-layout internals: ``redist_opt.ir.layout``).

Patch points. torch 2.13 looks ``redistribute_local_tensor`` up by name, at call
time, in these module namespaces (each imported it with ``from ... import``):

- ``torch.distributed.tensor._redistribute``: ``Redistribute.forward`` (explicit
  ``DTensor.redistribute`` and ``full_tensor``) and ``_redistribute_backward``
  (``NestedRedistribute``: the backward of every redistribution, and its
  double backward);
- ``torch.distributed.tensor._dispatch``: implicit reshards of op inputs
  (``OpDispatcher.redistribute_local_args``), forward and backward ops alike;
- ``torch.distributed.tensor._api``: ``_FromTorchTensor.backward`` (the gradient
  of ``from_local`` and the ``grad_placements`` given to ``to_local`` /
  ``full_tensor`` arrive here as a reshard of the incoming gradient);
- ``torch.distributed.tensor.experimental._tp_transform``: the TP export transform.

Replacing the name in each namespace routes every one of those callers, eager
and while AOTAutograd traces a compiled program, without touching
``DTensor.redistribute`` itself (Dynamo keeps seeing torch's own method).

Bindings imported by name outside torch are found by identity: the rule is in
:mod:`redist_opt.runtime.bindings`.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Shard

from redist_opt.torch_api.c10d import (
    are_we_tracing,
    default_store,
    group_name,
    process_group_ranks,
    process_rank,
)
from redist_opt.torch_api.c10d import are_we_tracing as _funcol_are_we_tracing
from redist_opt.torch_api.local_tensor import (
    int_on_rank,
    ints_on_every_rank,
    is_per_rank,
    local_tensor_mode,
    map_per_rank,
    per_rank_tensors,
)
from redist_opt.torch_api.placements import StridedShard as _StridedShard
from redist_opt.torch_api.placements import apply_and_release_mask, is_mask_partial, mask_partition
from redist_opt.torch_api.tracing import (
    get_active_debug_mode,
    outside_tracing,
    running_autograd_node,
    traced_without_graph,
)
from redist_opt.torch_api.version import PrivateName, TorchAPIError, at_least, private, resolve_declared

_REDISTRIBUTE = "torch.distributed.tensor._redistribute"
_SPEC = "torch.distributed.tensor._dtensor_spec"
_COLLECTIVE_UTILS = "torch.distributed.tensor._collective_utils"
_DISPATCH = "torch.distributed.tensor._dispatch"

DTensorSpec = private(_SPEC, "DTensorSpec")
TensorMeta = private(_SPEC, "TensorMeta")
_clear_sharding_prop_cache = private("torch.distributed.tensor.debug", "_clear_sharding_prop_cache")
# torch's planner: its plan cache (what its own call runs), the uncached planner it
# wraps (what it runs while tracing), the lookup of a flattened mesh its merge pass
# merges over, and the switch that turns that merge pass off.
_gen_transform_infos = private(_REDISTRIBUTE, "_gen_transform_infos")
_gen_transform_infos_non_cached = private(_REDISTRIBUTE, "_gen_transform_infos_non_cached")
_get_flattened_mesh_by_layout = private(_REDISTRIBUTE, "_get_flattened_mesh_by_layout")
_disable_merge_pass = private(_REDISTRIBUTE, "disable_redistribute_transform_optimization")

__all__ = [
    "needs_torch_planner",
    "torch_plan_steps",
    "make_spec",
    "respec",
    "spec_with_dtype",
    "tensor_meta",
    "reference_semantics",
    "TORCH_REDISTRIBUTE_LOCAL",
    "REDISTRIBUTE_LOCAL_PATCH_POINTS",
    "TORCH_REDISTRIBUTE_COST",
    "TORCH_COST_UNITS_PER_SECOND",
    "REDISTRIBUTE_COST_PATCH_POINTS",
    "patch_point_modules",
    "process_group_ranks",
    "default_store",
    "PRIVATE_NAMES",
    "REDISTRIBUTE_LOGGERS",
    "install_redistribute_cost",
    "restore_redistribute_cost",
    "clear_sharding_strategy_caches",
    "shape_is_symbolic",
    "record_redistribute",
    "dispatched_op",
    "traced_without_graph",
    "running_autograd_node",
    "outside_tracing",
    "local_tensor_of",
    "spec_of_dtensor",
    "make_dtensor",
    "local_tensor_mode",
    "is_per_rank",
    "map_per_rank",
    "per_rank_tensors",
    "int_on_rank",
    "ints_on_every_rank",
    "is_mask_partial",
    "mask_partition",
    "apply_and_release_mask",
    "hits_uneven_all_gather_merge",
    "uneven_all_gather_merge_in",
    "PLANNER_ERRORS",
    "TorchHandBack",
    "torch_transform_infos",
    "ZERO_FILLS_SHARD_TO_PARTIAL",
    "partial_target_refusal",
    "shard_to_partial_reason",
    "may_zero_fill",
    "torch_plan_zero_fills",
    "process_rank",
    "group_name",
    "are_we_tracing",
    "debug_mode_active",
]

# torch's own function, captured before anyone patches it: our fallback and oracle.
TORCH_REDISTRIBUTE_LOCAL = private(_REDISTRIBUTE, "redistribute_local_tensor")

# The modules holding ``redistribute_local_tensor`` by name (``from ... import``), per
# release: the same four in 2.11, 2.13 and 2.15 (read in their sources). A module a
# release should have that is missing, or lacks the name, raises at install.
_REDISTRIBUTE_LOCAL_SITES = (
    PrivateName(_REDISTRIBUTE, "redistribute_local_tensor"),
    PrivateName("torch.distributed.tensor._dispatch", "redistribute_local_tensor"),
    PrivateName("torch.distributed.tensor._api", "redistribute_local_tensor"),
    PrivateName("torch.distributed.tensor.experimental._tp_transform", "redistribute_local_tensor"),
)
REDISTRIBUTE_LOCAL_PATCH_POINTS = tuple(p.module for p in _REDISTRIBUTE_LOCAL_SITES if p.expected)


# -- the cost DTensor's sharding propagation chooses op strategies by ------------------

# torch's ``redistribute_cost(current_spec, target_spec)``: modelled time of torch's
# own plan, in microseconds (its alpha-beta helpers return ``latency_us + bw_s * 1e6``).
TORCH_REDISTRIBUTE_COST = private(_COLLECTIVE_UTILS, "redistribute_cost")
TORCH_COST_UNITS_PER_SECOND = 1e6

# Where torch 2.13's sharding propagation looks ``redistribute_cost`` up by name:
# ``_ops.utils.generate_redistribute_costs``, which fills every OpSpec's
# ``redistribute_cost`` matrix (strategy functions and the single-dim strategy
# expansion alike); ``ShardingPropagator`` then picks the strategy of least total.
# (``_utils.ExplicitRedistributionContext`` only asks whether a cost is <= 0, and
# the unused Dijkstra expansion prices steps itself: neither is patched.)
# The same module in 2.11, 2.13 and 2.15.
_REDISTRIBUTE_COST_SITES = (PrivateName("torch.distributed.tensor._ops.utils", "redistribute_cost"),)
REDISTRIBUTE_COST_PATCH_POINTS = tuple(p.module for p in _REDISTRIBUTE_COST_SITES if p.expected)

# torch's DTensor redistribution loggers (``logging.getLogger(__name__)`` in these
# modules; redist_opt's tools quiet them in benchmarks).
REDISTRIBUTE_LOGGERS = (_COLLECTIVE_UTILS, _REDISTRIBUTE)

# torch 2.14's ``Shard -> Partial("sum")`` zero-fill (see ZERO_FILLS_SHARD_TO_PARTIAL).
_SHARD_TO_PARTIAL = PrivateName(
    "torch.distributed.tensor.placement_types", "Shard._to_partial_tensor", since=(2, 14)
)

# Every private torch name this module reaches, and the releases that have it (read
# in the sources of torch 2.11 to 2.15; checked against the installed torch by
# tests/test_package_structure.py). Each one the installed release should have is
# resolved here, at import.
PRIVATE_NAMES = (
    *_REDISTRIBUTE_LOCAL_SITES,
    *_REDISTRIBUTE_COST_SITES,
    PrivateName(_REDISTRIBUTE),
    PrivateName(_REDISTRIBUTE, "_gen_transform_infos"),
    PrivateName(_REDISTRIBUTE, "_gen_transform_infos_non_cached"),
    PrivateName(_REDISTRIBUTE, "_get_flattened_mesh_by_layout"),
    PrivateName(_REDISTRIBUTE, "disable_redistribute_transform_optimization"),
    PrivateName(_REDISTRIBUTE, "_TransformInfo._comm_type_key"),
    PrivateName(_COLLECTIVE_UTILS),
    PrivateName(_DISPATCH, "OpDispatcher.redistribute_local_args"),
    PrivateName(_COLLECTIVE_UTILS, "redistribute_cost"),
    PrivateName(_SPEC, "DTensorSpec"),
    PrivateName(_SPEC, "DTensorSpec.is_default_device_order"),
    PrivateName(_SPEC, "TensorMeta"),
    PrivateName("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
    _SHARD_TO_PARTIAL,
    PrivateName("torch.distributed.tensor", "DTensor._local_tensor", instance=True),
    PrivateName("torch.distributed.tensor", "DTensor._spec", instance=True),
)
resolve_declared(PRIVATE_NAMES)


def patch_point_modules(names, attr: str) -> list:
    """The modules ``names`` (patch points of this release), each holding ``attr``;
    :class:`TorchAPIError` naming the first that is missing or lacks it."""
    modules = []
    for name in names:
        module = private(name)
        if attr not in vars(module):
            raise TorchAPIError(
                f"redist_opt patches {name}.{attr}, which torch {torch.__version__} does not have"
            )
        modules.append(module)
    return modules


def install_redistribute_cost(replacement) -> dict:
    """Point each cost patch point's ``redistribute_cost`` at ``replacement``;
    returns {module: previous value} for :func:`restore_redistribute_cost`."""
    previous = {}
    for module in patch_point_modules(REDISTRIBUTE_COST_PATCH_POINTS, "redistribute_cost"):
        previous[module] = module.redistribute_cost
        module.redistribute_cost = replacement
    return previous


def restore_redistribute_cost(previous: dict, replacement) -> None:
    """Undo :func:`install_redistribute_cost` where the name still holds ``replacement``."""
    for module, value in previous.items():
        if module.redistribute_cost is replacement:
            module.redistribute_cost = value


def clear_sharding_strategy_caches() -> None:
    """Forget the strategies DTensor's sharding propagation cached per op schema (its
    Python cache and the C++ dispatch fast path's): they were chosen by the cost
    function in place when they were computed."""
    _clear_sharding_prop_cache()


def shape_is_symbolic(spec: DTensorSpec) -> bool:
    """True when the global shape holds SymInts without a constant value (dynamic shapes)."""
    meta = spec.tensor_meta
    if meta is None:
        return False
    for s in meta.shape:
        if isinstance(s, torch.SymInt) and s.node.maybe_as_int() is None:
            return True
    return False


def record_redistribute(
    local_tensor, current: DTensorSpec, target: DTensorSpec, summary: str, is_explicit: bool
):
    """The context torch opens so an active ``DebugMode`` logs a redistribution (or a no-op)."""
    debug_mode = get_active_debug_mode()
    if debug_mode is None:
        return contextlib.nullcontext()
    return debug_mode.record_redistribute_calls(
        local_tensor, current.placements, target.placements, summary, is_explicit=is_explicit
    )


def debug_mode_active() -> bool:
    """Whether a ``DebugMode`` is recording (torch asks the same on every call)."""
    return get_active_debug_mode() is not None


def dispatched_op(frame) -> str | None:
    """The aten op DTensor's dispatcher is resharding inputs for, found on the Python
    stack from ``frame`` outwards (``redist_opt.record`` names call sites by it), or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_DISPATCH_FILE):
            local = frame.f_locals
            op_info = local.get("op_info")  # OpDispatcher.redistribute_local_args
            # (its schema is None when the C++ fast path made the OpInfo)
            if op_info is not None and op_info.schema is not None:
                return str(op_info.schema.op)
            if local.get("op_call") is not None:  # OpDispatcher.dispatch, an outer frame
                return str(local["op_call"])
        frame = frame.f_back
    return None


_DISPATCH_FILE = "/".join(("distributed", "tensor", "_dispatch.py"))
# The dispatcher's reshard of op inputs takes ``op_info`` (an OpInfo: ``.schema.op``) in
# 2.11 to 2.15: checked here, so a rename fails loudly instead of records losing the op.
if "op_info" not in private(_DISPATCH, "OpDispatcher.redistribute_local_args").__code__.co_varnames:
    raise TorchAPIError(
        f"redist_opt reads op_info in {_DISPATCH}.OpDispatcher.redistribute_local_args, "
        f"which torch {torch.__version__} does not take"
    )


def tensor_meta(shape, stride, dtype) -> TensorMeta:
    return TensorMeta(shape=torch.Size(shape), stride=tuple(stride), dtype=dtype)


def make_spec(mesh, placements, meta: TensorMeta | None) -> DTensorSpec:
    return DTensorSpec(mesh, tuple(placements), tensor_meta=meta)


def respec(spec: DTensorSpec, *, placements=None, tensor_meta=None) -> DTensorSpec:
    return DTensorSpec(
        spec.device_mesh,
        placements=tuple(placements) if placements is not None else spec.placements,
        tensor_meta=tensor_meta if tensor_meta is not None else spec.tensor_meta,
        use_strided_shard_as_shard_order=spec.use_strided_shard_as_shard_order,
    )


def spec_with_dtype(spec: DTensorSpec, dtensor, dtype: torch.dtype) -> DTensorSpec:
    return respec(spec, tensor_meta=tensor_meta(dtensor.shape, dtensor.stride(), dtype))


def needs_torch_planner(current: DTensorSpec, target: DTensorSpec) -> str | None:
    """Why torch plans this in a way we do not lower, or None. (A ``_StridedShard`` read as a
    shard order, the default, is lowered: ``redist_opt.ir.strided``.)

    Calls under ``use_min_cost_redistribution_plan()`` are ours otherwise: the flag only
    picks between torch's greedy planner (which ``redist_opt.ir.lower`` replays) and its
    graph-based one. Their step lists differ (the graph-based planner may run
    ``S(0) -> S(1)`` as a gather and a chunk, or reduce over the mesh dims in another
    order), but for default shard orders and no ``Shard -> Partial`` step they compute the
    same redistribution: the same placements, and the same value on every rank for
    exact-valued data, which ``tests/api/test_planner_agreement.py`` checks for every
    placement pair of a 2x2 mesh under both planners, on every release. A call with a
    ``Shard -> Partial`` step (:func:`shard_to_partial_reason`) is handed back, whichever
    planner torch runs it with; so is one whose ``Partial("sum")`` target torch 2.15's
    graph-based planner reaches by a zero-fill (:func:`may_zero_fill`), which depends on
    the plan torch's call finds in its cache: the eager path reads it per call."""
    reason = shard_to_partial_reason(current, target)
    if reason is not None:
        return reason
    for spec, role in ((current, "source"), (target, "target")):
        if spec.shard_order is None:  # _StridedShard encodes the order (use_strided_shard_as_shard_order)
            continue
        if any(type(p).__name__ == "_StridedShard" for p in spec.placements):
            return f"{role} treats _StridedShard as a plain shard (use_strided_shard_as_shard_order=False)"
        if not DTensorSpec.is_default_device_order(spec.shard_order):
            return f"{role} has a non-default shard order (planned by torch's graph-based planner)"
    return None


# -- transitions to Partial: what each release accepts -------------------------------

# torch 2.15 adds Shard -> Partial("sum"): each rank puts its shard at its offset in a
# zero-filled tensor of the step's logical shape (``Shard._to_partial_tensor``), with no
# collective. Its greedy planner emits it as any other step, its graph-based planner only
# toward a requested Partial("sum") target (an explicit-only edge); ``DTensor.redistribute``
# accepts it for a ``Shard`` source (not ``_StridedShard``) and ``Partial("sum")`` exactly.
# torch 2.13 and earlier refuse every transition to a Partial the DTensor does not have.
# Gated by the release the name was declared for (tests check the name is there exactly then).
ZERO_FILLS_SHARD_TO_PARTIAL: bool = _SHARD_TO_PARTIAL.expected


def partial_target_refusal(source, target) -> str | None:
    """The message of the RuntimeError the installed torch's ``DTensor.redistribute`` raises
    for ``source -> target`` on one mesh dim (before it plans anything), or None where it
    accepts that transition. Only a Partial ``target`` the DTensor does not already have is
    checked there: torch 2.13 refuses every one, torch 2.15 all but ``Shard -> Partial("sum")``."""
    if not target.is_partial() or source == target:
        return None
    if not ZERO_FILLS_SHARD_TO_PARTIAL:
        return (
            f"Can not redistribute from {source} to {target}, "
            "redistributing to Partial is for internal use only!"
        )
    if isinstance(source, Shard) and type(target) is Partial and target.reduce_op == "sum":
        return None
    return (
        f"Can not redistribute from {source} to {target}, "
        "only Shard to Partial(sum) redistribution is supported!"
    )


def shard_to_partial_reason(current: DTensorSpec, target: DTensorSpec) -> str | None:
    """Why a call that turns a shard into a Partial on some mesh dim runs through torch's
    own function, or None when it has no such step. redist_opt does not lower it: torch
    2.15 zero-fills ``Shard -> Partial("sum")`` (and raises its own error for any other
    reduce op, ``_MaskPartial`` or a ``_StridedShard`` source), torch 2.13 raises its own
    error for every one. Read from the placements only: every rank decides alike."""
    for s, t in zip(current.placements, target.placements):
        if s != t and t.is_partial() and isinstance(s, (Shard, _StridedShard)):
            if ZERO_FILLS_SHARD_TO_PARTIAL:
                return "Shard -> Partial is torch's local zero-fill, which redist_opt does not lower"
            return "Shard -> Partial: this torch refuses it, and raises its own error"
    return None


def may_zero_fill(current: DTensorSpec, target: DTensorSpec) -> bool:
    """Whether torch's own call could run a ``Shard -> Partial("sum")`` zero-fill for this
    call although no mesh dim goes from a shard to a Partial: torch 2.15's graph-based
    planner (``use_min_cost_redistribution_plan()``) reaches a ``Partial("sum")`` target
    from Replicate by a chunk and a zero-fill where it finds that cheaper (its explicit-only
    edge is generated toward such a target), where the greedy planner, and redist_opt's
    lowering, divide by the group size: the same sum, other values on the ranks. Read from
    the placements only; False on a torch without the zero-fill."""
    if not ZERO_FILLS_SHARD_TO_PARTIAL:
        return False
    return any(
        type(t) is Partial and t.reduce_op == "sum" and s != t
        for s, t in zip(current.placements, target.placements)
    )


def torch_plan_zero_fills(
    current: DTensorSpec, target: DTensorSpec, use_graph_based_transform: bool | None = None
) -> bool:
    """Whether torch's own call for this one runs a ``Shard -> Partial`` step (see
    :func:`may_zero_fill`; False at once where it cannot), read from the plan that call
    runs (:func:`torch_transform_infos`: its plan cache, which ignores
    ``use_min_cost_redistribution_plan()``, so the answer can change after
    ``_gen_transform_infos.cache_clear()``; a caller that remembers it checks it again per
    call). True where torch's planner raises one of its own errors (:data:`PLANNER_ERRORS`):
    the call goes to torch, which raises that error."""
    if not may_zero_fill(current, target):
        return False
    try:
        infos = torch_transform_infos(current, target, use_graph_based_transform)
    except PLANNER_ERRORS:  # torch's own call raises this: hand it back
        return True
    return any(
        isinstance(i.src_dst_placements[0], (Shard, _StridedShard)) and i.src_dst_placements[1].is_partial()
        for i in infos
    )


# What torch's planner (``_gen_transform_infos_non_cached`` and what it calls, read in
# 2.11, 2.13 and 2.15) raises for an input it cannot plan: AssertionError (its
# invariants), ValueError (a spec it cannot read, ``_StridedShardNotDecodableError``),
# RuntimeError (``NotImplementedError``, the spec's own checks), and IndexError / KeyError
# (a shard dim past the tensor's, read as ``logical_shape[dim]``). torch's own call raises
# the same before it runs anything; any other error (an ImportError, AttributeError or
# TypeError: a name or signature that moved) is not the planner's and propagates.
PLANNER_ERRORS = (AssertionError, ValueError, RuntimeError, LookupError)


def torch_transform_infos(
    current: DTensorSpec, target: DTensorSpec, use_graph_based_transform: bool | None = None
) -> list:
    """The steps torch's own ``redistribute_local_tensor`` runs for this call, read as it
    reads them: from its plan cache (``_gen_transform_infos``, positional arguments as
    torch passes them: one cache entry for both), uncached while tracing. Raises what
    torch's planner raises.

    torch's cache key ignores ``use_min_cost_redistribution_plan()``: which of its two
    planners made a cached entry depends on which call came first (until
    ``_gen_transform_infos.cache_clear()``). Reading the entry here, at the call, gives
    what torch's call would run, whatever that order was."""
    if _funcol_are_we_tracing():  # torch plans uncached while tracing: so do we
        return _gen_transform_infos_non_cached(current, target, use_graph_based_transform)
    return _gen_transform_infos(current, target, use_graph_based_transform)


def hits_uneven_all_gather_merge(
    current: DTensorSpec, target: DTensorSpec, use_graph_based_transform: bool | None = None
) -> bool | None:
    """Whether torch's merge pass (``_optimize_transform_infos``, the same body from 2.11 to
    2.15) would merge all_gathers of an unevenly sharded tensor dim into one flattened
    all_gather, which it does wrongly (it checks evenness for reduce_scatter only; fixed
    upstream in pytorch PR 194457): consecutive ``Shard(d) -> Replicate`` steps in
    descending mesh dim order, a flattened mesh over their dims, and the logical size of
    ``d`` at the outermost of them (the size torch pads the merged gather by) not
    divisible by the product of their sizes.

    The steps are torch's own for this call (:func:`torch_transform_infos`, with
    ``use_graph_based_transform`` as the caller passed it), so the call that follows
    finds them planned. Under LocalTensorMode the logical size is one value per
    simulated rank: uneven on any rank is a hit (the merge pass is then off for every
    rank, which is correct for all). A symbolic size (dynamic shapes) cannot be checked:
    a hit, so torch's unmerged plan runs, right for every size.

    None (not False) when torch's planner raises one of its own errors
    (:data:`PLANNER_ERRORS`) for this call: nothing was decided, and an undecided check
    never counts as "no bug": a caller turns torch's merge pass off, which is right for
    every input (torch's own call plans before it merges anything, so it raises that same
    error either way). Any other error (a boundary name that changed) propagates."""
    try:
        infos = torch_transform_infos(current, target, use_graph_based_transform)
    except PLANNER_ERRORS:  # torch's call raises the same error: undecided, not "no bug"
        return None
    return uneven_all_gather_merge_in(infos, current.mesh)


def uneven_all_gather_merge_in(infos, mesh) -> bool:
    """:func:`hits_uneven_all_gather_merge` on torch's steps ``infos`` for ``mesh``."""
    i = 0
    while i < len(infos):
        j = i + 1
        if infos[i]._comm_type_key() == "all_gather":
            while j < len(infos) and infos[j].src_dst_placements == infos[i].src_dst_placements:
                j += 1
        run = infos[i:j]
        i = j
        dims = tuple(r.mesh_dim for r in run)
        if len(run) < 2 or dims != tuple(sorted(dims, reverse=True)):
            continue
        if _get_flattened_mesh_by_layout(mesh, tuple(sorted(dims))) is None:
            continue
        n = 1
        for d in dims:
            n *= mesh.size(d)
        outermost = run[-1]  # the smallest mesh dim: its logical shape is the merged gather's
        sizes = ints_on_every_rank(outermost.logical_shape[outermost.src_dst_placements[0].dim])
        if sizes is None or any(size % n for size in sizes):
            return True
    return False


_NO_MERGE = object()


class TorchHandBack:
    """torch's own call for one (current spec, target spec, ``use_graph_based_transform``)
    that redist_opt hands back: torch's merge pass on, as torch runs it (a hand-back is
    never worse than torch), except where torch's plan for the call hits the uneven
    all_gather merge bug (:func:`hits_uneven_all_gather_merge`): then the merge pass is
    off for the call. Where the check cannot run (torch's planner raises one of its own
    errors for the call) the merge pass is off too, which is right for every input; torch's
    own call then raises that error, as it would with the pass on.

    Built once per decided call and kept by the callers' call caches. ``mergeable``:
    whether the mesh's root has a flattened mesh (torch's merge pass merges only over
    one): without one nothing can merge, whichever plan torch runs, and torch's function
    is called directly. With one, which plan torch runs is read at each call (one lookup
    in torch's plan cache, the one torch's call does next): torch's cache ignores
    ``use_min_cost_redistribution_plan()``, so after ``_gen_transform_infos.cache_clear()``
    the same specs may get the other planner's steps. The bug check reruns only when that
    plan object changed."""

    __slots__ = ("plan", "merge_off")

    def __init__(self, mergeable: bool) -> None:
        self.plan = None if mergeable else _NO_MERGE
        self.merge_off = False

    def merges_off(self, current: DTensorSpec, target: DTensorSpec, use_graph_based_transform=None) -> bool:
        """Whether torch's merge pass is off for this call."""
        if self.plan is _NO_MERGE:
            return False
        try:
            plan = torch_transform_infos(current, target, use_graph_based_transform)
        except PLANNER_ERRORS:  # undecided: off, right for every input (torch's call raises it)
            return True
        if plan is not self.plan:  # the first call, a new cache entry, or tracing (planned afresh)
            self.merge_off = uneven_all_gather_merge_in(plan, current.mesh)
            self.plan = plan
        return self.merge_off

    def __call__(
        self,
        local_tensor,
        current: DTensorSpec,
        target: DTensorSpec,
        async_op: bool = False,
        is_explicit: bool = False,
        **kwargs,
    ):
        """torch's ``redistribute_local_tensor(local_tensor, current, target, async_op=,
        is_explicit=, **kwargs)``; called as a call cache's runner is (positional
        ``async_op`` and ``is_explicit``)."""
        if self.merges_off(current, target, kwargs.get("use_graph_based_transform")):
            with reference_semantics():
                return TORCH_REDISTRIBUTE_LOCAL(
                    local_tensor, current, target, async_op=async_op, is_explicit=is_explicit, **kwargs
                )
        return TORCH_REDISTRIBUTE_LOCAL(
            local_tensor, current, target, async_op=async_op, is_explicit=is_explicit, **kwargs
        )


def reference_semantics():
    """Context manager: torch's redistribute with its merge pass disabled (our oracle)."""
    return _disable_merge_pass()


def torch_plan_steps(mesh, src, dst, shape, dtype=torch.float32):
    """(mesh_dim, src, dst, logical_shape) of every step torch's planner emits, for
    cross-checking ours (tests/ir/test_lower.py). The logical shape is the calling
    rank's (under LocalTensorMode: SymInts holding every simulated rank's value)."""
    meta = tensor_meta(shape, _contiguous_stride(shape), dtype)
    infos = _gen_transform_infos_non_cached(make_spec(mesh, src, meta), make_spec(mesh, dst, meta))
    return [(i.mesh_dim, *i.src_dst_placements, tuple(i.logical_shape)) for i in infos]


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(tuple(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


# -- a DTensor's parts -------------------------------------------------------------


def local_tensor_of(dtensor: DTensor) -> torch.Tensor:
    """The DTensor's local tensor itself (not ``to_local()``'s autograd view)."""
    return dtensor._local_tensor


def spec_of_dtensor(dtensor: DTensor) -> DTensorSpec:
    return dtensor._spec


# Whether torch's ``Redistribute.forward`` (``DTensor.redistribute``) casts the local tensor
# its redistribution returned to the forward dtype (``dtype_config["out_dtype"]``, torch 2.13
# and later) or returns it as it came (torch 2.11 and 2.12, whose forward takes
# ``forward_dtype`` and builds the DTensor from the output directly). The two differ where the
# local redistribution changes the dtype: under LocalTensorMode a reduce_scatter with "avg" of
# an integer tensor returns ``sum / n`` as a float (``_local_functional_reduce_scatter_tensor``
# in ``torch/distributed/_local_tensor/_c10d.py``, every release), which 2.13 casts back
# (truncating) and 2.11 / 2.12 keep as float32.
REDISTRIBUTE_CASTS_OUTPUT: bool = at_least(2, 13)


def make_dtensor(local_tensor: torch.Tensor, spec: DTensorSpec, *, requires_grad: bool) -> DTensor:
    """A DTensor of ``local_tensor`` with ``spec``, as torch's own Redistribute builds it."""
    return DTensor(local_tensor, spec, requires_grad=requires_grad)
