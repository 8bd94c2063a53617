"""Placements: parsing the short string forms, normalising, and validating.

Users write placements as torch ``Placement`` objects or as the strings torch
prints (``"R"``, ``"S(0)"``, ``"S(-1)"``, ``"P"``, ``"P(avg)"``, ``"P(max)"``).
A partial p-norm (torch's ``_NormPartial(p)``, the placement of a sharded
``vector_norm``) is written ``"P(norm2)"``, ``"P(norm0.5)"``; its reduce op is
``"norm(p)"`` (:func:`reduce_op_of`). As torch's ``get_placement_from_reduction_op``
does for the norms it makes, ``P(norm_inf)`` / ``P(norm-inf)`` / ``P(norm0)``
normalise to ``Partial("max")`` / ``Partial("min")`` / ``Partial("sum")``.
Every check here raises :class:`RedistributeError` naming the offending
placement, its mesh dim and the mesh, before anything runs: bad input never
produces a tensor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from redist_opt.torch_api.placements import NormPartial, StridedShard

__all__ = [
    "RedistributeError",
    "parse_placement",
    "parse_placements",
    "normalize_placements",
    "placement_str",
    "placements_str",
    "REDUCE_OPS",
    "reduce_op_of",
    "partial_of",
    "norm_type_of",
    "normalize_norm_partial",
    "shard_order",
]

# Reductions a Partial placement can carry that redist_opt lowers.
REDUCE_OPS = ("sum", "avg", "max", "min", "product")


class RedistributeError(ValueError):
    """Bad input to a redistribution: the message names the offending item."""


_SHARD_RE = re.compile(r"^S(?:hard)?\((?:dim=)?\s*(-?\d+)\s*\)$")
_PARTIAL_RE = re.compile(r"^P(?:artial)?(?:\(\s*['\"]?(\w+)['\"]?\s*\))?$")
_NORM_RE = re.compile(
    r"^(?:P\(\s*norm_?|_NormP(?:artial)?\(\s*)([-+]?(?:inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))\s*\)$"
)
_NORM_OP_RE = re.compile(r"^norm\((.+)\)$")
# torch prints _StridedShard(0, split_factor=2) as "_S(0, 2)" (str) or
# "_StridedShard(dim=0, sf=2)" (repr).
_STRIDED_RE = re.compile(
    r"^_S(?:tridedShard)?\(\s*(?:dim=)?\s*(-?\d+)\s*,\s*(?:sf=|split_factor=)?\s*(\d+)\s*\)$"
)


def _norm_str(p) -> str:
    p = float(p)
    if math.isinf(p):
        return "inf" if p > 0 else "-inf"
    return str(int(p)) if p.is_integer() else repr(p)


def normalize_norm_partial(p: Placement) -> Placement:
    """torch's ``_NormPartial`` for inf / -inf / 0 as the plain partial torch itself
    uses for those norms (``get_placement_from_reduction_op``: max, min, sum of
    counts); every other placement unchanged."""
    if isinstance(p, NormPartial):
        q = float(p.norm_type)
        if q == math.inf:
            return Partial("max")
        if q == -math.inf:
            return Partial("min")
        if q == 0:
            return Partial("sum")
    return p


def norm_type_of(p: Placement):
    """p of a partial p-norm placement, else None."""
    return p.norm_type if isinstance(p, NormPartial) else None


def reduce_op_of(p: Placement) -> str | None:
    """The reduction a partial placement stands for: ``"sum"``, ..., ``"norm(2)"``."""
    if isinstance(p, NormPartial):
        return f"norm({_norm_str(p.norm_type)})"
    return p.reduce_op if isinstance(p, Partial) else None


def partial_of(op: str) -> Partial:
    """The partial placement of a reduce op (inverse of :func:`reduce_op_of`)."""
    m = _NORM_OP_RE.match(op)
    if m:
        return NormPartial(_parse_norm_type(m.group(1)))
    return Partial(op)


def _parse_norm_type(text: str):
    text = text.strip().lstrip("_")
    if text in ("inf", "+inf", "-inf"):
        return float(text)
    v = float(text)
    return int(v) if re.fullmatch(r"[-+]?\d+", text) else v


def parse_placement(p: Placement | str) -> Placement:
    """``"S(0)"`` -> ``Shard(0)``; Placement objects pass through."""
    if isinstance(p, Placement):
        return p
    if not isinstance(p, str):
        raise RedistributeError(f"placement {p!r} is neither a torch Placement nor a string")
    text = p.strip()
    if text in ("R", "Replicate", "Replicate()"):
        return Replicate()
    m = _SHARD_RE.match(text)
    if m:
        return Shard(int(m.group(1)))
    m = _STRIDED_RE.match(text)
    if m:
        return StridedShard(int(m.group(1)), split_factor=int(m.group(2)))
    m = _NORM_RE.match(text)
    if m:
        return normalize_norm_partial(NormPartial(_parse_norm_type(m.group(1))))
    m = _PARTIAL_RE.match(text)
    if m:
        op = m.group(1) or "sum"
        if op not in REDUCE_OPS:
            raise RedistributeError(
                f"placement {p!r}: unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}"
            )
        return Partial(op)
    raise RedistributeError(
        f"cannot parse placement {p!r}; expected R, S(<dim>), _S(<dim>, <split factor>), P, "
        "P(avg), P(max), P(min), P(product) or P(norm<p>)"
    )


def parse_placements(placements: Sequence[Placement | str] | str) -> tuple[Placement, ...]:
    """A sequence of placements, or one comma-separated string such as ``"R,S(0),P"``."""
    if isinstance(placements, str):
        placements = _split_top_level(placements)
    return tuple(parse_placement(p) for p in placements)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [s.strip() for s in parts]


def shard_order(
    placements: Sequence[Placement], mesh_sizes: Sequence[int]
) -> dict[int, tuple[int, ...]] | None:
    """Per sharded tensor dim, the mesh dims that shard it in shard order (outermost
    first), or None when ``_StridedShard`` split factors name no order.

    Without ``_StridedShard`` that is the default left-to-right order. With it, the
    decoding is torch's ``_maybe_convert_StridedShard_to_shard_order`` (_dtensor_spec.py):
    right to left, a placement with split factor ``sf`` goes where the sizes of the
    mesh dims already before it in the order multiply to ``sf`` (``Shard``: 1). FSDP2 +
    TP's ``[_S(0, tp), S(0)]`` decodes to tensor dim 0 sharded by tp, then dp.
    """
    order: dict[int, list[int]] = {}
    for d in reversed(range(len(placements))):
        p = placements[d]
        if not isinstance(p, (Shard, StridedShard)):
            continue
        dims = order.setdefault(p.dim, [])
        sf = int(p.split_factor) if isinstance(p, StridedShard) else 1
        acc = 1
        for i in range(len(dims) + 1):
            if acc == sf:
                dims.insert(i, d)
                break
            if i < len(dims):
                acc *= mesh_sizes[dims[i]]
        else:
            return None
    return {t: tuple(ds) for t, ds in sorted(order.items())}


def placement_str(p: Placement) -> str:
    if isinstance(p, NormPartial):
        return f"P(norm{_norm_str(p.norm_type)})"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    return str(p)


def placements_str(ps: Sequence[Placement]) -> str:
    return "[" + ", ".join(placement_str(p) for p in ps) + "]"


def normalize_placements(
    placements: Sequence[Placement | str] | str,
    *,
    mesh_shape: Sequence[int],
    tensor_ndim: int,
    role: str,
) -> tuple[Placement, ...]:
    """Parse, check against the mesh and tensor, and make shard dims non-negative.

    ``role`` ("source" / "target") only shapes the error messages.
    """
    ps = parse_placements(placements)
    mesh_desc = "x".join(str(s) for s in mesh_shape)
    if len(ps) != len(mesh_shape):
        raise RedistributeError(
            f"{role} placements {placements_str(ps)} have {len(ps)} entries but the mesh "
            f"({mesh_desc}) has {len(mesh_shape)} dims: give one placement per mesh dim"
        )
    out: list[Placement] = []
    for mesh_dim, p in enumerate(ps):
        if isinstance(p, (Shard, StridedShard)):
            dim = p.dim
            if not -tensor_ndim <= dim < tensor_ndim:
                raise RedistributeError(
                    f"{role} placement {placement_str(p)} on mesh dim {mesh_dim} of mesh "
                    f"({mesh_desc}): shard dim {dim} is out of range for a {tensor_ndim}-D tensor"
                )
            if dim < 0:
                p = (
                    StridedShard(dim + tensor_ndim, split_factor=p.split_factor)
                    if isinstance(p, StridedShard)
                    else Shard(dim + tensor_ndim)
                )
        elif isinstance(p, NormPartial):
            p = normalize_norm_partial(p)
        elif isinstance(p, Partial):
            if p.reduce_op not in REDUCE_OPS:
                raise RedistributeError(
                    f"{role} placement {placement_str(p)} on mesh dim {mesh_dim}: reduce op "
                    f"{p.reduce_op!r} is not supported (supported: {', '.join(REDUCE_OPS)})"
                )
        elif not isinstance(p, Replicate):
            raise RedistributeError(
                f"{role} placement {p!r} on mesh dim {mesh_dim} is not a Replicate, Shard or Partial"
            )
        out.append(p)
    ops = {reduce_op_of(p) for p in out if isinstance(p, Partial)}
    # As torch's assert_no_mixed_partial_types: sum and avg commute (both linear),
    # so they may mix; any other mix has no defined order of reductions.
    # A norm mixed with another reduction is left to torch (lower.unsupported_reason).
    if len(ops) > 1 and ops != {"sum", "avg"} and not any(o.startswith("norm(") for o in ops):
        raise RedistributeError(
            f"{role} placements {placements_str(out)} mix partial reduce ops {sorted(ops)}: "
            "DTensor does not define the order of different reductions (only sum and avg may mix)"
        )
    return tuple(out)
