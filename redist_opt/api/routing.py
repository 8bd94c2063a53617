"""``enabled()``: route every DTensor redistribution through redist_opt.

``enabled()`` replaces torch's ``redistribute_local_tensor`` in the namespaces that
call it (torch's own: ``torch_dtensor.REDISTRIBUTE_LOCAL_PATCH_POINTS``; and any
module that bound it by name, found by identity: the rule is in
:mod:`redist_opt.runtime.bindings`) with :func:`routed_redistribute_local_tensor`.
The patch is process-wide (the name is a module global), installed by the first
block of the process and restored by the last one to exit: outside every block,
every binding is torch's own function again, object for object. Which options
apply is per thread: the calling thread's innermost enabled() block, or, for a
thread that entered none (autograd's device threads run backward on GPUs), the
most recently entered block of any thread. A reference to the routed function
kept elsewhere still works outside every block: it calls torch's function.

Cost. Entering and leaving a block costs the same whatever the number of
modules loaded: the bindings are kept in a registry (``runtime.bindings``) and
only modules imported since the last block are scanned. A routed call seen
before (same specs, dtype and options) runs from ``eager.cached_runner``: a
program specialized to this rank. A call handed back to torch before (same specs
and ``use_graph_based_transform``) finds that decision with one lookup and runs
torch's function: none of our checks run again, so it costs what torch's call costs.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch.distributed.tensor.placement_types import Partial

from redist_opt.api import costs as api_costs
from redist_opt.api import eager, planning
from redist_opt.api.errors import as_torch_error, warn_once
from redist_opt.ir.options import PlanOptions
from redist_opt.ir.placements import REDUCE_OPS, RedistributeError, placements_str
from redist_opt.runtime import bindings
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm

__all__ = [
    "enabled",
    "active_options",
    "active_cost_options",
    "routed_redistribute_local_tensor",
    "routed_redistribute_cost",
    "LOWERED_REDUCE_OPS",
    "OBSERVERS",
]

# Reduce ops the IR lowers; a Partial with any other op (torch's Partial accepts
# every c10d reduce op, "prod" included) is run by torch's redistribute.
LOWERED_REDUCE_OPS = REDUCE_OPS

_route_lock = threading.Lock()
_route_entries: list = []  # [(token, thread id, options)] in entry order
_route_previous = None  # what bindings.install_redistribute_local replaced, and the replacement
_cost_tokens: set = set()  # tokens of the blocks entered with costs=True
_cost_previous: dict | None = None  # what install_redistribute_cost replaced
_route_local = threading.local()

# Called as ``observer(local_tensor, current_spec, target_spec, torch_only_reason)`` for
# every redistribution routed inside enabled() (``redist_opt.record`` appends here).
OBSERVERS: list = []


def active_options() -> PlanOptions | None:
    """The options of the enabled() block that applies to the calling thread, or None."""
    stack = getattr(_route_local, "stack", None)
    if stack:
        return stack[-1][1]
    entries = _route_entries
    return entries[-1][2] if entries else None


def active_cost_options() -> PlanOptions | None:
    """The options of the block that applies to the calling thread if it was entered
    with ``costs=True``, else None."""
    stack = getattr(_route_local, "stack", None)
    if stack:
        token, options = stack[-1]
    else:
        entries = _route_entries
        if not entries:
            return None
        token, _, options = entries[-1]
    return options if token in _cost_tokens else None


def routed_redistribute_cost(current_spec, target_spec) -> float:
    """Stands in for torch's ``redistribute_cost`` in sharding propagation while a
    ``costs=True`` block is active: ours under such a block, torch's otherwise."""
    options = active_cost_options()
    if options is None:
        return tdt.TORCH_REDISTRIBUTE_COST(current_spec, target_spec)
    return api_costs.redistribute_cost(current_spec, target_spec, options=options)


def _torch_only_reason(current_spec, target_spec, use_graph_based_transform, torch_only) -> str | None:
    """Why this call must run through torch's own function (None: redist_opt plans it)."""
    if torch_only:
        return f"torch passed arguments redist_opt does not model: {sorted(torch_only)}"
    if use_graph_based_transform:
        return "torch's graph-based planner was requested (use_graph_based_transform=True)"
    if current_spec.mesh != target_spec.mesh:
        return "the source and target meshes differ"  # torch raises its own error for this
    if tdt.shape_is_symbolic(current_spec):
        return "the global shape is symbolic (dynamic shapes); redist_opt plans concrete shapes only"
    return tdt.needs_torch_planner(current_spec, target_spec) or _unlowered_reduce_op(
        current_spec, target_spec
    )


def routed_redistribute_local_tensor(
    local_tensor,
    current_spec,
    target_spec,
    *,
    async_op: bool = False,
    use_graph_based_transform=None,
    is_explicit: bool = False,
    **torch_only,
):
    """Stands in for torch's ``redistribute_local_tensor`` inside ``enabled()``."""
    options = active_options()
    if options is None or torch.compiler.is_dynamo_compiling():
        # Dynamo traces torch's own code; AOTAutograd, which runs after it, comes
        # back here with Dynamo off and traces our plan into the graph.
        return tdt.TORCH_REDISTRIBUTE_LOCAL(
            local_tensor,
            current_spec,
            target_spec,
            async_op=async_op,
            use_graph_based_transform=use_graph_based_transform,
            is_explicit=is_explicit,
            **torch_only,
        )
    if not torch_only and not OBSERVERS:
        if use_graph_based_transform is None:
            run = eager.cached_runner(local_tensor, current_spec, target_spec, options)
            if run is not None:  # a call seen before: one lookup, then torch's function or our program
                return run(local_tensor, current_spec, target_spec, async_op, is_explicit)
        handed_back = _handed_back_before(current_spec, target_spec, use_graph_based_transform)
        if handed_back is not None:  # handed back before: one lookup, then torch's own call
            return handed_back.torch_call(
                local_tensor,
                current_spec,
                target_spec,
                async_op=async_op,
                use_graph_based_transform=use_graph_based_transform,
                is_explicit=is_explicit,
            )
    return _first_call(
        local_tensor,
        current_spec,
        target_spec,
        options,
        async_op,
        use_graph_based_transform,
        is_explicit,
        torch_only,
    )


def _first_call(
    local_tensor,
    current_spec,
    target_spec,
    options,
    async_op,
    use_graph_based_transform,
    is_explicit,
    torch_only,
):
    """A routed call not found by ``cached_runner`` or ``_handed_back_before``: decide,
    warn, record, plan and run it."""
    reason = _torch_only_reason(current_spec, target_spec, use_graph_based_transform, torch_only)
    if OBSERVERS:
        for observer in tuple(OBSERVERS):
            observer(local_tensor, current_spec, target_spec, reason)
    if reason is not None:
        warn_once(("route", reason), f"redist_opt: using torch's redistribute: {reason}")
        hand_back = _HandBack(current_spec.mesh)
        if not torch_only:
            _remember_hand_back(current_spec, target_spec, use_graph_based_transform, hand_back)
        return hand_back.torch_call(
            local_tensor,
            current_spec,
            target_spec,
            async_op=async_op,
            use_graph_based_transform=use_graph_based_transform,
            is_explicit=is_explicit,
            **torch_only,
        )
    summary = (
        f"redist_opt {placements_str(current_spec.placements)} -> {placements_str(target_spec.placements)}"
    )
    with tdt.record_redistribute(local_tensor, current_spec, target_spec, summary, is_explicit):
        try:
            return eager.redistribute_local_tensor(
                local_tensor, current_spec, target_spec, async_op=async_op, options=options
            )
        except RedistributeError as ours:
            raise as_torch_error(ours, local_tensor, current_spec, target_spec) from None


# -- calls handed back to torch ---------------------------------------------------------

# (current spec, target spec, use_graph_based_transform, under LocalTensorMode) -> _HandBack.
# Whether a call is handed back depends only on these (and on the mesh's flattened
# meshes, checked per call like ``eager.cached_runner``): a call seen before reruns none
# of the checks. Whether torch's merge pass is off for it (the uneven merge bug) depends
# on the plan torch runs, which ``tdt.TorchHandBack`` reads from torch's plan cache at
# each call where the mesh has a flattened mesh (torch's cache ignores
# ``use_min_cost_redistribution_plan()``, so that plan is not a function of this key).
_handed_back: dict = {}
_HANDED_BACK_LIMIT = 65536


class _HandBack:
    __slots__ = ("mesh_ref", "root", "flattened", "torch_call")

    def __init__(self, device_mesh) -> None:
        self.mesh_ref = weakref.ref(device_mesh)
        self.root = tm.root_mesh(device_mesh)
        self.flattened = tm.flattened_count(self.root)
        self.torch_call = tdt.TorchHandBack(mergeable=self.flattened > 0)


def _hand_back_key(current_spec, target_spec, use_graph_based_transform):
    return (current_spec, target_spec, use_graph_based_transform, tdt.local_tensor_mode() is not None)


def _handed_back_before(current_spec, target_spec, use_graph_based_transform) -> _HandBack | None:
    try:
        hit = _handed_back.get(_hand_back_key(current_spec, target_spec, use_graph_based_transform))
    except TypeError:  # a symbolic shape (dynamic shapes while tracing) is not hashable
        return None
    if (
        hit is None
        or hit.mesh_ref() is not current_spec.mesh
        or hit.flattened != tm.flattened_count(hit.root)
    ):
        return None
    return hit


def _remember_hand_back(current_spec, target_spec, use_graph_based_transform, hand_back: _HandBack) -> None:
    try:
        key = _hand_back_key(current_spec, target_spec, use_graph_based_transform)
        hash(key)
    except TypeError:
        return
    if len(_handed_back) > _HANDED_BACK_LIMIT:
        _handed_back.clear()
    _handed_back[key] = hand_back


planning.CLEAR_HOOKS.append(_handed_back.clear)


def _unlowered_reduce_op(current_spec, target_spec) -> str | None:
    for spec in (current_spec, target_spec):
        for p in spec.placements:
            if isinstance(p, Partial) and p.reduce_op not in LOWERED_REDUCE_OPS:
                return f"Partial({p.reduce_op!r}) is not lowered by redist_opt"
    return None


@contextlib.contextmanager
def enabled(groups="existing", *, costs: bool = False, options: PlanOptions | None = None, **fields):
    """Route every DTensor redistribution through redist_opt inside the block.

    Covers explicit ``DTensor.redistribute`` and ``full_tensor``, implicit reshards
    of op inputs, the backward of all of those, gradients arriving through
    ``from_local`` / ``to_local(grad_placements=...)``, and ``torch.compile``
    called inside the block (AOTAutograd traces our plans into the forward and
    backward graphs). The plan options are ``options=PlanOptions(...)`` or its
    fields as keywords (``groups`` first, then those of :func:`optimize`), checked
    here. Nests; the innermost block of the calling thread decides the options.

    ``costs=True`` also makes DTensor's sharding propagation choose op strategies
    by :func:`redist_opt.redistribute_cost` (the modelled time of our optimized
    plans, with this block's options) instead of torch's estimate. DTensor caches
    the strategy it chose per op schema: those caches are cleared whenever a block
    is entered or left while a ``costs=True`` block is active, so choices made by
    one cost function are not reused under the other. (Threads running DTensor
    ops at the same time, one inside such a block and one outside, can still
    meet each other's cached choices.)
    """
    if options is None or groups != "existing":
        fields["groups"] = groups
    entry_options = PlanOptions.of(options, **fields)
    token, stack = _enter(entry_options, bool(costs))
    try:
        yield
    finally:
        _leave(token, stack)


def _enter(entry_options: PlanOptions, costs: bool) -> tuple[object, list]:
    """Push a block's options on this thread's stack (installing the patches for the
    first block of the process); returns the block's token and the stack."""
    global _route_previous, _cost_previous
    token = object()
    stack = getattr(_route_local, "stack", None)
    if stack is None:
        stack = _route_local.stack = []
    with _route_lock:
        if not _route_entries:
            # whatever routed_redistribute_local_tensor is now (a harness may wrap it)
            replacement = routed_redistribute_local_tensor
            _route_previous = (bindings.install_redistribute_local(replacement), replacement)
        cost_blocks_before = bool(_cost_tokens)
        if costs:
            if not _cost_tokens:
                _cost_previous = tdt.install_redistribute_cost(routed_redistribute_cost)
            _cost_tokens.add(token)
        _route_entries.append((token, threading.get_ident(), entry_options))
        stack.append((token, entry_options))
        if cost_blocks_before or costs:
            tdt.clear_sharding_strategy_caches()
    return token, stack


def _leave(token: object, stack: list) -> None:
    """Remove the block ``token`` (and the patches with the last block of the process)."""
    global _route_previous, _cost_previous
    with _route_lock:
        if stack and stack[-1][0] is token:  # the usual case: blocks leave innermost first
            stack.pop()
        else:
            stack[:] = [e for e in stack if e[0] is not token]
        if _route_entries and _route_entries[-1][0] is token:
            _route_entries.pop()
        else:
            _route_entries[:] = [e for e in _route_entries if e[0] is not token]
        cost_blocks_before = bool(_cost_tokens)
        _cost_tokens.discard(token)
        if cost_blocks_before and not _cost_tokens:
            tdt.restore_redistribute_cost(_cost_previous, routed_redistribute_cost)
            _cost_previous = None
        if cost_blocks_before:
            tdt.clear_sharding_strategy_caches()
        if not _route_entries:
            bindings.restore_redistribute_local(*_route_previous)
            _route_previous = None
