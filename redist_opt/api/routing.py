"""``enabled()``: route every DTensor redistribution through redist_opt.

``enabled()`` replaces torch's ``redistribute_local_tensor`` in the namespaces that
call it (torch's own: ``torch_dtensor.REDISTRIBUTE_LOCAL_PATCH_POINTS``; and any
module that bound it by name, found by identity, before or while the block runs:
the rule is below) with
:func:`routed_redistribute_local_tensor`. The patch is process-wide (the name is a
module global) and installed once, reference-counted; which options apply is
per thread: the calling thread's innermost enabled() block, or, for a thread
that entered none (autograd's device threads run backward on GPUs), the most
recently entered block of any thread. Outside every block the patched name
calls torch's function unchanged.

Which bindings are routed. Bindings outside torch (autoparallel's ``ordered_sharding`` does ``from
torch.distributed.tensor._redistribute import redistribute_local_tensor``) are
found by identity, not by name: :func:`install_redistribute_local` replaces
every module global in ``sys.modules`` that *is* torch's function, whatever the
module or the name it is bound to (redist_opt's own modules excepted: they hold
torch's function as the fallback). The rule for modules imported while the patch
is in place: torch's own ``_redistribute.redistribute_local_tensor`` holds the
replacement too, so a ``from ... import`` made then binds the replacement; on
:func:`restore_redistribute_local` every binding that was replaced gets its value
back, and every binding of the replacement in a module imported meanwhile gets
torch's function (what it would have imported outside). Only module globals are
reached (not class attributes, closures or containers); a reference to the
replacement kept elsewhere after the restore still works: outside every
``enabled()`` block it calls torch's function. A module seen with no binding is
not scanned again while it is the same object in ``sys.modules`` with as many
globals (an import adds one), so entering a block walks ``sys.modules`` rather
than every module's globals.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import torch
from torch.distributed.tensor.placement_types import Partial

from redist_opt.api import costs as api_costs
from redist_opt.api import eager
from redist_opt.api.errors import as_torch_error, check_groups, warn_once
from redist_opt.ir.placements import REDUCE_OPS, RedistributeError, placements_str
from redist_opt.runtime import torch_dtensor as tdt

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
_route_previous = None  # what install_redistribute_local replaced
_cost_tokens: set = set()  # tokens of the blocks entered with costs=True
_cost_previous: dict | None = None  # what install_redistribute_cost replaced
_route_local = threading.local()

# Called as ``observer(local_tensor, current_spec, target_spec, torch_only_reason)`` for
# every redistribution routed inside enabled() (``redist_opt.record`` appends here).
OBSERVERS: list = []


def active_options() -> dict | None:
    """The options of the enabled() block that applies to the calling thread, or None."""
    stack = getattr(_route_local, "stack", None)
    if stack:
        return stack[-1][1]
    entries = _route_entries
    return entries[-1][2] if entries else None


def active_cost_options() -> dict | None:
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
    return api_costs.redistribute_cost(current_spec, target_spec, **options)


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
    return tdt.needs_torch_planner(current_spec, target_spec) or _unlowered_reduce_op(current_spec, target_spec)


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

    def torch_fn():
        return tdt.TORCH_REDISTRIBUTE_LOCAL(
            local_tensor, current_spec, target_spec, async_op=async_op,
            use_graph_based_transform=use_graph_based_transform, is_explicit=is_explicit, **torch_only,
        )

    if torch.compiler.is_dynamo_compiling():
        # Dynamo traces torch's own code; AOTAutograd, which runs after it, comes
        # back here with Dynamo off and traces our plan into the graph.
        return torch_fn()
    options = active_options()
    if options is None:
        return torch_fn()
    reason = _torch_only_reason(current_spec, target_spec, use_graph_based_transform, torch_only)
    if OBSERVERS:
        for observer in tuple(OBSERVERS):
            observer(local_tensor, current_spec, target_spec, reason)
    if reason is not None:
        warn_once(("route", reason), f"redist_opt: using torch's redistribute: {reason}")
        if tdt.hits_uneven_all_gather_merge(current_spec, target_spec):
            with tdt.reference_semantics():  # torch's merge pass is wrong for this input
                return torch_fn()
        return torch_fn()
    summary = f"redist_opt {placements_str(current_spec.placements)} -> {placements_str(target_spec.placements)}"
    with tdt.record_redistribute(local_tensor, current_spec, target_spec, summary, is_explicit):
        try:
            return eager.redistribute_local_tensor(
                local_tensor, current_spec, target_spec, async_op=async_op, **options
            )
        except RedistributeError as ours:
            raise as_torch_error(ours, local_tensor, current_spec, target_spec) from None


def _unlowered_reduce_op(current_spec, target_spec) -> str | None:
    for spec in (current_spec, target_spec):
        for p in spec.placements:
            if isinstance(p, Partial) and p.reduce_op not in LOWERED_REDUCE_OPS:
                return f"Partial({p.reduce_op!r}) is not lowered by redist_opt"
    return None


@contextlib.contextmanager
def enabled(groups: str | Sequence = "existing", *, costs: bool = False, **options):
    """Route every DTensor redistribution through redist_opt inside the block.

    Covers explicit ``DTensor.redistribute`` and ``full_tensor``, implicit reshards
    of op inputs, the backward of all of those, gradients arriving through
    ``from_local`` / ``to_local(grad_placements=...)``, and ``torch.compile``
    called inside the block (AOTAutograd traces our plans into the forward and
    backward graphs). ``options`` (passes, cost, prefer, max_collectives) go to :func:`optimize`.
    Nests; the innermost block of the calling thread decides the options.

    ``costs=True`` also makes DTensor's sharding propagation choose op strategies
    by :func:`redist_opt.redistribute_cost` (the modelled time of our optimized
    plans, with this block's options) instead of torch's estimate. DTensor caches
    the strategy it chose per op schema: those caches are cleared whenever a block
    is entered or left while a ``costs=True`` block is active, so choices made by
    one cost function are not reused under the other. (Threads running DTensor
    ops at the same time, one inside such a block and one outside, can still
    meet each other's cached choices.)
    """
    check_groups(groups)
    unknown = set(options) - {"passes", "cost", "prefer", "max_collectives"}
    if unknown:
        raise RedistributeError(
            f"enabled(): unknown options {sorted(unknown)} (expected costs, passes, cost, prefer, max_collectives)"
        )
    if options.get("passes") is not None:
        options["passes"] = tuple(options["passes"])
    entry_options = dict(groups=groups if isinstance(groups, str) else tuple(groups), **options)
    token, stack = _enter(entry_options, bool(costs))
    try:
        yield
    finally:
        _leave(token, stack)


def _enter(entry_options: dict, costs: bool) -> tuple[object, list]:
    """Push a block's options on this thread's stack (installing the patches for the
    first block of the process); returns the block's token and the stack."""
    global _route_previous, _cost_previous
    token = object()
    stack = getattr(_route_local, "stack", None)
    if stack is None:
        stack = _route_local.stack = []
    with _route_lock:
        if not _route_entries:
            _route_previous = tdt.install_redistribute_local(routed_redistribute_local_tensor)
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
        stack[:] = [e for e in stack if e[0] is not token]
        _route_entries[:] = [e for e in _route_entries if e[0] is not token]
        cost_blocks_before = bool(_cost_tokens)
        _cost_tokens.discard(token)
        if cost_blocks_before and not _cost_tokens:
            tdt.restore_redistribute_cost(_cost_previous, routed_redistribute_cost)
            _cost_previous = None
        if cost_blocks_before:
            tdt.clear_sharding_strategy_caches()
        if not _route_entries:
            tdt.restore_redistribute_local(_route_previous, routed_redistribute_local_tensor)
            _route_previous = None
