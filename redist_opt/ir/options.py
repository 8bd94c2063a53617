"""``PlanOptions``: how a redistribution is planned, as one value.

Every entry point that plans (``optimize``, ``redistribute``, ``enabled``,
``backend``, ``redistribute_cost``, and the compiled-graph pass's
``optimize_graph``, ``compiler_fn`` and ``RedistGraphPass``; not ``plan``, which
builds the naive plan DTensor would run and decides nothing) takes these options as keyword
arguments or as ``options=PlanOptions(...)``, builds one ``PlanOptions`` there
(which checks every field) and passes that value down: the pipeline reads its
fields, and the plan caches use it as (part of) their key. It is frozen and
hashable, so two calls with equal options share cached plans.

Fields:

- ``groups``: "existing" (only communicators that exist), "create" (merged
  collectives may create flattened groups on first use), or a sequence of
  mesh-dim groups that may be created (``["dp+cp"]``; checked against the mesh
  by ``optimize``, the first place a mesh is known);
- ``passes``: pass classes to run instead of the default pipeline (None: the default);
- ``cost``: a :class:`~redist_opt.ir.cost.CostModel`, a built-in profile name
  ("nccl", "gloo", "gloo-ring") or the path of a profile file written by
  ``redist-opt calibrate`` (None: ``$REDIST_OPT_COST_PROFILE``, else the mesh
  backend's profile); stored as the ``CostModel`` it names;
- ``prefer``: "time", or "consistency" to merge every reduction a group allows;
- ``max_collectives``: "torch" caps a plan's collectives at torch 2.13's
  shipped plan's; "any" lets the cost model trade launches for bytes;
- ``without``: names of default-pipeline passes to leave out, everything else
  kept (the collective cap included): what an ablation turns off. Unlike
  ``passes``, it keeps the cap; an unknown name raises when the pipeline runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from redist_opt.ir.cost import BUILTIN_PROFILES, CostModel, load_profile
from redist_opt.ir.placements import RedistributeError

__all__ = ["PlanOptions", "GROUP_POLICIES", "MAX_COLLECTIVES", "PREFER"]

GROUP_POLICIES = ("existing", "create")
MAX_COLLECTIVES = ("torch", "any")
PREFER = ("time", "consistency")
_FIELD_ORDER = ("groups", "passes", "cost", "prefer", "max_collectives", "without")


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """How to plan a redistribution (see the module docstring); checked when built."""

    groups: str | tuple = "existing"
    passes: tuple | None = None
    cost: CostModel | None = None
    prefer: str = "time"
    max_collectives: str = "torch"
    without: tuple = ()

    def __post_init__(self) -> None:
        # Normalizing in __post_init__ (the dataclass idiom for frozen classes) keeps
        # PlanOptions(cost="gloo", groups=[...]) and PlanOptions.of(...) one value.
        object.__setattr__(self, "groups", _groups(self.groups))
        object.__setattr__(self, "passes", _passes(self.passes))
        object.__setattr__(self, "cost", _cost(self.cost))
        object.__setattr__(self, "without", _without(self.without))
        if self.prefer not in PREFER:
            raise RedistributeError(f"prefer={self.prefer!r}: expected 'time' or 'consistency'")
        if self.max_collectives not in MAX_COLLECTIVES:
            raise RedistributeError(
                f"max_collectives={self.max_collectives!r}: expected one of {MAX_COLLECTIVES}"
            )
        # Hashed on every cached eager call (it is part of the hot-plan key): once here.
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f) for f in _FIELD_ORDER)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, options: PlanOptions | None = None, **fields) -> PlanOptions:
        """``options`` with ``fields`` replaced (the keyword arguments of the public
        functions); an unknown keyword raises ``RedistributeError`` naming it."""
        unknown = set(fields) - _FIELDS
        if unknown:
            raise RedistributeError(
                f"unknown options {sorted(unknown)} (expected options=PlanOptions(...) or "
                f"{', '.join(sorted(_FIELDS))})"
            )
        if options is None:
            value = cls(**fields)
        elif not isinstance(options, PlanOptions):
            raise RedistributeError(f"options={options!r}: expected a redist_opt.PlanOptions")
        else:
            value = dataclasses.replace(options, **fields) if fields else options
        # One object per distinct value: cache keys built from it then compare by identity.
        if len(_interned) > _INTERNED_LIMIT:
            _interned.clear()
        return _interned.setdefault(value, value)


_FIELDS = frozenset(_FIELD_ORDER)
assert _FIELD_ORDER == tuple(f.name for f in dataclasses.fields(PlanOptions))


_interned: dict = {}
_INTERNED_LIMIT = 1024


def _groups(groups):
    if isinstance(groups, str):
        if groups not in GROUP_POLICIES:
            raise RedistributeError(
                f"groups={groups!r}: expected 'existing', 'create' or a list of allowed groups"
            )
        return groups
    if not isinstance(groups, (Sequence, set, frozenset)):
        raise RedistributeError(
            f"groups={groups!r}: expected 'existing', 'create' or a list of mesh-dim groups such as ['dp+cp']"
        )
    # each group is checked against the mesh by optimize (names or dims it must have)
    return tuple(tuple(g) if isinstance(g, list) else g for g in groups)


def _passes(passes):
    if passes is None:
        return None
    if isinstance(passes, (str, bytes)) or not isinstance(passes, (Sequence, set, frozenset)):
        raise RedistributeError(f"passes={passes!r}: expected a list of pass classes, or None")
    for p in passes:  # a pass class names itself (``name``); a name alone is without='s
        if not (isinstance(p, type) and isinstance(getattr(p, "name", None), str)):
            raise RedistributeError(
                f"passes={passes!r}: {p!r} is not a pass class (to leave passes out by name, use without=)"
            )
    return tuple(passes)


def _without(without):
    """Pass names (or pass classes, read by their ``name``) as a sorted tuple of names."""
    if isinstance(without, (str, bytes)) or not isinstance(without, (Sequence, set, frozenset)):
        raise RedistributeError(f"without={without!r}: expected a list of pass names")
    names = []
    for item in without:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str) or not name:
            raise RedistributeError(f"without={without!r}: {item!r} is not a pass name or pass class")
        names.append(name)
    return tuple(sorted(set(names)))


def _cost(cost):
    if cost is None or isinstance(cost, CostModel):
        return cost
    if isinstance(cost, (str, os.PathLike)):
        try:
            return load_profile(cost)
        except OSError as e:
            raise RedistributeError(
                f"cost={os.fspath(cost)!r}: not a cost profile name ({', '.join(BUILTIN_PROFILES)}) "
                f"and not a readable profile file: {e.strerror or e}"
            ) from None
        except ValueError as e:
            raise RedistributeError(f"cost={os.fspath(cost)!r}: {e}") from None
    raise RedistributeError(
        f"cost={cost!r}: expected a CostModel, a profile name ({', '.join(BUILTIN_PROFILES)}) "
        "or the path of a profile file"
    )
