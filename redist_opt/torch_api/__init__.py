"""The boundary to torch's private APIs: one module per surface.

redist_opt builds on names torch does not promise to keep (DTensor's planner and
specs, DeviceMesh's layouts, LocalTensorMode's per-rank values, c10d's group
registry, Inductor's pass hooks, FX's tracing modes). Each surface has one module
here that knows which torch releases it was checked on, declares every private
name it reaches (``PRIVATE_NAMES``) and resolves each one its release should have
when it is imported (:func:`redist_opt.torch_api.version.resolve_declared`), so a
name that moved makes ``import redist_opt`` raise
:class:`~redist_opt.torch_api.version.TorchAPIError` naming it and the installed
version, instead of quietly turning a feature off. (Names in modules torch loads
lazily, Inductor's compiler and Dynamo's backends, are declared ``lazy`` and
resolve, as loudly, at first use.) No other module of the package touches a private torch name
(``tests/test_package_structure.py`` walks every module's AST to check it);
docs/architecture.md lists the names, their module and the versions checked.

This package is the bottom layer: it imports torch and nothing of redist_opt's
but itself.
"""
