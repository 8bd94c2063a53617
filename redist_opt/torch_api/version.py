"""The installed torch's release, and the one way a boundary module reaches a
private torch name: loudly.

:func:`private` imports ``module`` and reads ``name`` from it; when either is
missing it raises :class:`TorchAPIError`, an ``ImportError`` that names the
module, the name and the installed torch version. A boundary module calls it at
import for names every supported release has, and inside the function that
needs it for names only some releases have, so a missing name fails where it is
first used and never turns into a silent default.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings

import torch

__all__ = [
    "TORCH_VERSION",
    "TORCH_VERSION_STRING",
    "SUPPORTED",
    "TorchAPIError",
    "at_least",
    "private",
    "has_private",
    "PrivateName",
    "resolve_declared",
]

TORCH_VERSION_STRING: str = torch.__version__.split("+")[0]


def _release(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise TorchAPIError(f"redist_opt cannot read torch's version from {torch.__version__!r}")
    return int(match.group(1)), int(match.group(2))


class TorchAPIError(ImportError):
    """A private torch name redist_opt needs is missing or changed in the installed
    torch (the message names it and the version)."""


# (major, minor) of the installed torch.
TORCH_VERSION: tuple[int, int] = _release(torch.__version__)

# The releases redist_opt is checked on, oldest and newest (pyproject.toml states the same range).
SUPPORTED: tuple[tuple[int, int], tuple[int, int]] = ((2, 11), (2, 15))


def at_least(major: int, minor: int) -> bool:
    """Whether the installed torch is release ``major.minor`` or newer."""
    return TORCH_VERSION >= (major, minor)


def private(module: str, name: str | None = None):
    """``module`` (a torch module path) or its attribute ``name`` (dotted for a
    nested one: ``"DeviceMesh._flatten"``), or :class:`TorchAPIError` naming the
    missing name and the installed torch version."""
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise TorchAPIError(
            f"redist_opt needs torch's private module {module}, which torch {torch.__version__} "
            f"does not have ({e}); redist_opt is checked on torch {_range()}"
        ) from e
    if name is None:
        return obj
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise TorchAPIError(
                f"redist_opt needs torch's private name {module}.{name}, which torch "
                f"{torch.__version__} does not have; redist_opt is checked on torch {_range()}"
            ) from e
    return obj


def has_private(module: str, name: str) -> bool:
    """Whether the installed torch has ``module.name``: what the tests check each
    declaration's release range against. (A boundary's release switch is the
    declaration's :attr:`PrivateName.expected`, never whether the name is there.)"""
    try:
        private(module, name)
    except TorchAPIError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class PrivateName:
    """One private torch name a boundary module reaches, and the releases that have it.

    Each boundary module lists its names in a ``PRIVATE_NAMES`` tuple of these: the
    tests check that every name a release should have resolves on the installed torch
    (and that one it should not have is absent), and docs/architecture.md lists them.

    ``name``: None for the module itself; dotted for a nested name
    (``"DTensorSpec.is_default_device_order"``, ``"_c10d_functional.wait_tensor"``
    of ``torch.ops``). ``instance``: the last part of ``name`` is an attribute of the
    class's instances (``"DTensor._spec"``), which the class itself does not have.
    ``since`` / ``until``: the first and last release that have it (None: every
    supported one); a boundary's version gate for the name is its :attr:`expected`.
    ``lazy``: its module is one torch loads lazily (importing it costs seconds), so it
    is resolved at first use instead of at import (:func:`resolve_declared`).
    """

    module: str
    name: str | None = None
    since: tuple[int, int] | None = None
    until: tuple[int, int] | None = None
    instance: bool = False
    lazy: bool = False

    @property
    def path(self) -> str:
        return self.module if self.name is None else f"{self.module}.{self.name}"

    @property
    def expected(self) -> bool:
        """Whether the installed torch's release should have it."""
        return (self.since is None or TORCH_VERSION >= self.since) and (
            self.until is None or TORCH_VERSION <= self.until
        )

    def releases(self) -> str:
        """The releases that have it, as text ("2.13 and later")."""
        since = "" if self.since is None else "{}.{}".format(*self.since)
        until = "" if self.until is None else "{}.{}".format(*self.until)
        if since and until:
            return f"{since} to {until}"
        if since:
            return f"{since} and later"
        return f"up to {until}" if until else "every supported release"

    def get(self):
        """The object, or :class:`TorchAPIError` naming it, the installed torch and the
        releases that have it. (An ``instance`` attribute: the class.)"""
        if not self.expected:
            raise TorchAPIError(
                f"redist_opt needs torch's private name {self.path}, which torch {torch.__version__} "
                f"does not have (torch {self.releases()} does)"
            )
        name = self.name.rsplit(".", 1)[0] if self.instance else self.name
        return private(self.module, name)


def resolve_declared(names) -> None:
    """Resolve, at a boundary module's import, every declaration of ``names`` the
    installed release should have (an ``instance`` attribute: its class; a ``lazy``
    one is left to its first use); :class:`TorchAPIError` naming the first missing
    one and the installed torch version. (Reading a deprecated alias to see that it is
    there is not a use of it: torch's warning for reading one is not shown.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        for declaration in names:
            if declaration.expected and not declaration.lazy:
                declaration.get()


def _range() -> str:
    (a, b), (c, d) = SUPPORTED
    return f"{a}.{b} to {c}.{d}"


if not (SUPPORTED[0] <= TORCH_VERSION <= SUPPORTED[1]):
    warnings.warn(
        f"redist_opt is checked on torch {_range()}; torch {torch.__version__} is installed. "
        "A private torch name that moved raises TorchAPIError naming it.",
        UserWarning,
        stacklevel=2,
    )
