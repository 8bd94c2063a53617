"""The boundary to torch's private APIs: one module per surface.

redist_opt builds on names torch does not promise to keep (DTensor's planner and
specs, DeviceMesh's layouts, LocalTensorMode's per-rank values, c10d's group
registry, Inductor's pass hooks, FX's tracing modes). Each surface has one module
here that knows which torch releases it was checked on and reaches every private
name through :func:`redist_opt.torch_api.version.private`, so a name that moved
raises :class:`~redist_opt.torch_api.version.TorchAPIError` naming it and the
installed version, at import or at first use, instead of quietly turning a
feature off. No other module of the package touches a private torch name
(``tests/test_package_structure.py`` walks every module's AST to check it);
docs/architecture.md lists the names, their module and the versions checked.

This package is the bottom layer: it imports torch and nothing of redist_opt's
but itself.
"""
