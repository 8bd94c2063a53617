"""Where torch's ``redistribute_local_tensor`` is bound by name, and swapping it there.

``enabled()`` puts its routed function wherever code looks torch's function up by
name: torch's own callers (``torch_api.dtensor.REDISTRIBUTE_LOCAL_PATCH_POINTS``) and
every module global, in any module, that *is* torch's function (autoparallel's
``from torch.distributed.tensor._redistribute import redistribute_local_tensor``),
found by identity (redist_opt's own modules excepted: they hold torch's function
as the fallback).

Cost: the bindings found are kept in a registry, so installing and restoring
touch only them (a handful), whatever the number of modules loaded. Modules are
scanned once each: a scan runs only when ``sys.modules`` changed since the last
one (its length, or its last entry: imports append), and then reads only the
modules not scanned before (or replaced in ``sys.modules`` since). So a binding
is found when the module holding it is new since the last scan; a binding made
later in a module scanned before (``exec`` into an existing module) is not.

While a replacement is installed, torch's own ``_redistribute`` name holds it, so
a module imported then binds the replacement; such bindings are found by the
same scan (a global that is an installed replacement) and get torch's function
on restore, which is what they would have imported outside.
"""

from __future__ import annotations

import dataclasses
import sys

from redist_opt.torch_api.dtensor import (
    REDISTRIBUTE_LOCAL_PATCH_POINTS,
    TORCH_REDISTRIBUTE_LOCAL,
    patch_point_modules,
)

__all__ = ["RedistributeLocalPatch", "install_redistribute_local", "restore_redistribute_local"]

NAME = "redistribute_local_tensor"


@dataclasses.dataclass
class RedistributeLocalPatch:
    """What :func:`install_redistribute_local` replaced: {(module, name): previous value}."""

    previous: dict


# {(id(module), global name): (module, global name, name in sys.modules)} of every
# by-name binding found in the modules scanned so far.
_known: dict = {}
# {module name: module object} of the modules scanned.
_scanned: dict = {}
# sys.modules as of the last scan: (length, last name, last module's id).
_fingerprint: tuple | None = None
# Replacements installed now (a binding of one of them was torch's function).
_installed: list = []


def _is_own_module(name: str) -> bool:
    return name == "redist_opt" or name.startswith("redist_opt.")


def _modules_fingerprint() -> tuple:
    modules = sys.modules
    try:
        last = next(reversed(modules))
    except (StopIteration, RuntimeError):  # empty, or changed while read
        return (len(modules), None, None)
    return (len(modules), last, id(modules.get(last)))


def _scan_new_modules() -> None:
    """Register the bindings in modules loaded since the last scan (O(1) when none were)."""
    global _fingerprint, _scanned
    fingerprint = _modules_fingerprint()
    if fingerprint == _fingerprint:
        return
    # by id: the targets are alive (held here), and a set lookup per module global
    # keeps the scan of the thousands of modules Inductor loads cheap
    targets = {id(t) for t in (TORCH_REDISTRIBUTE_LOCAL, *_installed)}
    loaded = dict(list(sys.modules.items()))
    for mod_name, module in loaded.items():
        if _scanned.get(mod_name) is module or _is_own_module(mod_name):
            continue
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for attr, value in list(namespace.items()):
            if id(value) in targets:
                _known[(id(module), attr)] = (module, attr, mod_name)
    for key, (module, _, mod_name) in list(_known.items()):  # forget modules no longer loaded
        if loaded.get(mod_name) is not module:
            del _known[key]
    _scanned, _fingerprint = loaded, fingerprint


def install_redistribute_local(replacement) -> RedistributeLocalPatch:
    """Point every binding of torch's ``redistribute_local_tensor`` at ``replacement``:
    the name in torch's own callers, whatever they hold (a wrapper put there before
    is routed too), and every module global that is torch's function. Returns what
    :func:`restore_redistribute_local` needs."""
    _scan_new_modules()
    previous = {}
    # every patch point of this release holds the name (patch_point_modules raises otherwise)
    for module in patch_point_modules(REDISTRIBUTE_LOCAL_PATCH_POINTS, NAME):
        previous[(module, NAME)] = module.__dict__[NAME]
    for module, attr, _ in _known.values():
        if module.__dict__.get(attr) is TORCH_REDISTRIBUTE_LOCAL:
            previous.setdefault((module, attr), TORCH_REDISTRIBUTE_LOCAL)
    for module, attr in previous:
        setattr(module, attr, replacement)
    _installed.append(replacement)
    return RedistributeLocalPatch(previous)


def restore_redistribute_local(patch: RedistributeLocalPatch, replacement) -> None:
    """Undo :func:`install_redistribute_local`: each replaced binding that still holds
    ``replacement`` gets its value back (a later patch by someone else is left in
    place); a binding of ``replacement`` made meanwhile (a module imported inside
    the block) gets torch's function."""
    _scan_new_modules()
    for (module, attr), value in patch.previous.items():
        if module.__dict__.get(attr) is replacement:
            setattr(module, attr, value)
    for module, attr, _ in _known.values():
        if module.__dict__.get(attr) is replacement:
            setattr(module, attr, TORCH_REDISTRIBUTE_LOCAL)
    if replacement in _installed:
        _installed.remove(replacement)
