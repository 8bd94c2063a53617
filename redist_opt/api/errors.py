"""What the API refuses and how it says so: warn-once, and errors
that are also instances of the exception type torch raises for the same input."""

from __future__ import annotations

import logging
import warnings

from redist_opt.ir.placements import RedistributeError
from redist_opt.torch_api import dtensor as tdt

__all__ = ["warn_once", "torch_typed", "as_torch_error"]

logger = logging.getLogger("redist_opt")


# Keys already warned about in this process (tests clear it).
_warned: set = set()


def warn_once(key, message: str) -> None:
    """``warnings.warn`` and log ``message`` the first time ``key`` is seen."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
        logger.warning(message)


_torch_typed_errors: dict = {}


def torch_typed(kind: type, message: str) -> RedistributeError:
    """A RedistributeError that is also an instance of ``kind``, torch's type for this input."""
    cls = _torch_typed_errors.get(kind)
    if cls is None:
        cls = _torch_typed_errors[kind] = type(
            "RedistributeError", (RedistributeError, kind), {"__module__": __name__}
        )
    return cls(message)


def as_torch_error(ours: RedistributeError, local_tensor, current_spec, target_spec) -> Exception:
    """``ours`` as an instance of what torch raises for the same input.

    Asks torch's own function: if it raises too, the error returned is both a
    RedistributeError and an instance of torch's exception type, with our message
    (which names the placement, mesh dim and mesh) followed by torch's. If torch accepts the input,
    ours stands: redist_opt refuses what it can prove wrong rather than return it.
    """
    try:
        tdt.TORCH_REDISTRIBUTE_LOCAL(local_tensor, current_spec, target_spec)
    except Exception as theirs:  # noqa: BLE001 - any type torch raises is the one to match
        kind = type(theirs)
        if isinstance(ours, kind):
            return ours
        try:
            # torch's message too: code matching torch's wording keeps working
            err = torch_typed(kind, f"{ours} (torch: {theirs})")
        except TypeError:  # an exception type that cannot be combined (layout conflict)
            return ours
        err.__cause__ = theirs
        return err
    return ours
