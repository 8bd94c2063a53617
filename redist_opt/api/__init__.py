"""The API layer: what users call, and what the graph layer builds on.

Modules, bottom to top: ``errors`` (option checks, warn-once, torch-typed
errors), ``specs`` (MeshSpecs of DeviceMeshes, meshes planned on), ``planning``
(``plan``, ``optimize``, the hot-plan cache, ``clear_caches``), ``eager``
(``redistribute_local_tensor``), ``autograd`` (the differentiable redistribution),
``costs`` (``redistribute_cost``, our plans priced for planners), ``routing``
(``enabled``), ``public`` (``redistribute``), ``advice`` (which flattened groups
to create), ``recording`` (``record``), ``step_costs`` (``profile_steps``: in-step
collective costs as a cost profile).
"""

from redist_opt.api.costs import redistribute_cost
from redist_opt.api.eager import redistribute_local_tensor
from redist_opt.api.errors import warn_once
from redist_opt.api.planning import clear_caches, optimize, plan
from redist_opt.api.public import redistribute
from redist_opt.api.recording import Recording, record
from redist_opt.api.routing import enabled
from redist_opt.api.specs import recording_meshes, spec_of
from redist_opt.api.step_costs import StepCosts, profile_steps

__all__ = [
    "plan",
    "optimize",
    "redistribute",
    "redistribute_local_tensor",
    "redistribute_cost",
    "enabled",
    "clear_caches",
    "record",
    "Recording",
    "profile_steps",
    "StepCosts",
    # for the graph layer
    "warn_once",
    "recording_meshes",
    "spec_of",
]
