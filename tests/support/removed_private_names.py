"""Remove each private torch name redist_opt declares, one at a time, and import redist_opt.

Run as a script, in a process of its own (it takes torch's names away and puts them
back): prints one JSON object, {declared path: [outcome, message]}, where the outcome
is the type name of what importing the boundary (every ``redist_opt.torch_api``
module, afresh) raised with that name missing ("TorchAPIError" where the boundary
caught it), "imported" where it raised nothing,
or "kept" where the name cannot be taken out of torch (an op of ``torch.ops``, which
its namespace makes again on the next lookup; an entry of a config module, which is
not an attribute of its own).

Checked: every declaration the installed release should have, resolved at import
(not ``lazy``, whose module torch loads at first use, and not an ``instance``
attribute, which only objects of its class carry: the boundary checks the class).
A module is removed by making it unimportable (``sys.modules[name] = None``); a name
by deleting it from the object that holds it (for a class: the class of its MRO that
defines it). For the names of :data:`WHOLE_PACKAGE` the whole of ``import redist_opt``
runs afresh too, recorded under ``"import redist_opt: <path>"``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

# torch's plan cache and its uncached planner: read at call time before (a missing one
# then turned torch's uneven all_gather merge guard off silently), bound at import now.
WHOLE_PACKAGE = (
    "torch.distributed.tensor._redistribute._gen_transform_infos",
    "torch.distributed.tensor._redistribute._gen_transform_infos_non_cached",
)


def _purge(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def _boundary_modules() -> list[str]:
    import redist_opt.torch_api

    return [
        f"redist_opt.torch_api.{info.name}" for info in pkgutil.iter_modules(redist_opt.torch_api.__path__)
    ]


def _outcome(import_all) -> list[str]:
    """[what ``import_all()`` raised (its type name) or "imported", its message]."""
    try:
        import_all()
    except Exception as e:  # noqa: BLE001 - what the import raised is the result
        return [type(e).__name__, str(e)]
    return ["imported", ""]


def _declarations(modules) -> list:
    found = {}
    for name in modules:
        module = importlib.import_module(name)
        for d in getattr(module, "PRIVATE_NAMES", ()):
            if d.expected and not d.lazy and not d.instance:
                found.setdefault(d.path, d)
    return list(found.values())


def _remove(declaration):
    """Take ``declaration`` out of torch; returns the function that puts it back, or
    None where it cannot be taken out."""
    from redist_opt.torch_api.version import has_private, private

    if declaration.name is None:
        saved = sys.modules[declaration.module]
        sys.modules[declaration.module] = None

        def restore():
            sys.modules[declaration.module] = saved

        return restore
    parent, _, attr = declaration.name.rpartition(".")
    owner = private(declaration.module, parent) if parent else importlib.import_module(declaration.module)
    holders = [k for k in (owner.__mro__ if isinstance(owner, type) else (owner,)) if attr in vars(k)]
    if not holders:  # not an attribute of its own (a config module's entry)
        return None
    values = [vars(k)[attr] for k in holders]
    for k in holders:
        delattr(k, attr)

    def restore():
        for k, value in zip(holders, values):
            setattr(k, attr, value)

    if has_private(declaration.module, declaration.name):  # made again on lookup
        restore()
        return None
    return restore


def _import_boundary(modules):
    def run():
        for name in modules:
            importlib.import_module(name)

    return run


def _import_package():
    importlib.import_module("redist_opt")


def main() -> None:
    import redist_opt  # noqa: F401 - every module torch's names live in is loaded first

    modules = _boundary_modules()
    outcomes = {}
    for declaration in _declarations(modules):
        restore = _remove(declaration)
        if restore is None:
            outcomes[declaration.path] = ["kept", ""]
            continue
        whole = declaration.path in WHOLE_PACKAGE
        try:
            _purge("redist_opt.torch_api")  # the rest of the package stays: its import is not rerun
            outcomes[declaration.path] = _outcome(_import_boundary(modules))
            if whole:
                _purge("redist_opt")
                outcomes[f"import redist_opt: {declaration.path}"] = _outcome(_import_package)
        finally:
            restore()
            if whole:
                _purge("redist_opt")
                _import_package()
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
