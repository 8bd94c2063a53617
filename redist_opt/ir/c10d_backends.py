"""Which c10d backend (gloo, nccl, fake, ...) carries the collectives: of a mesh's groups,
of the default group, and of a job about to create its group.

A plan's cost profile is chosen by its mesh's backend (``MeshSpec.backend``), tuning and
in-step profiling start from the default group's, and ``redist-opt calibrate`` creates
the group of its launched ranks: all three read torch's backend names here, so they
cannot disagree about what a name like ``"cpu:gloo,cuda:nccl"`` or ``"undefined"`` means
or about which device this process computes on. Only public APIs (``get_backend``,
``get_backend_config``, ``torch.accelerator``), and a group resolved by its name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from redist_opt.ir import layout as L
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.c10d import process_group

__all__ = [
    "device_type",
    "backend_for_device",
    "process_group_backend",
    "world_backend",
    "launch_backend",
]


def device_type() -> str:
    """This process's device type: its accelerator's (``torch.accelerator``), else ``"cpu"``."""
    return torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"


def backend_for_device(name: str, device_type: str) -> str:
    """The backend a group named by ``get_backend`` runs for ``device_type``: ``name``
    itself, or its entry for that device when it names one per device
    (``"cpu:gloo,cuda:nccl"``, a default group torch created for both)."""
    if ":" not in name:
        return name
    per_device = dict(item.split(":", 1) for item in name.split(",") if ":" in item)
    return per_device.get(device_type, name)


def process_group_backend(device_mesh) -> str | None:
    """The backend name of the mesh's process groups for its device type, or None.

    ``get_backend`` may name one backend per device ("cpu:gloo,cuda:nccl"); the
    mesh's device type picks one. Dims on different backends give None. A dim of size 1
    carries no collective, and a ``fake`` group moves no data: torchtitan's
    ``ParallelDims`` builds its meshes with ``backend_override={dim: "fake"}`` for every
    dim of degree 1, so those dims do not count while another dim has a real backend.
    """
    if not dist.is_initialized() or not tm.rank_in_mesh(device_mesh):
        return None  # (a rank outside the mesh has none of its groups, and runs none of its collectives)
    by_dim = {}
    # No error is turned into None here: None means "the nccl default", so a group whose
    # backend cannot be read must fail loudly rather than quietly pick the GPU model.
    for d in range(device_mesh.ndim):
        name = str(dist.get_backend(process_group(L.group_name(device_mesh, d))))
        by_dim[d] = backend_for_device(name, device_mesh.device_type)
    # the dims that carry collectives, or every dim of a mesh of one rank
    found = {name for d, name in by_dim.items() if device_mesh.size(d) > 1} or set(by_dim.values())
    if len(found) > 1:
        found.discard("fake")
    return found.pop() if len(found) == 1 else None


def world_backend() -> str:
    """The default group's backend for this process's device: ``get_backend()``, or for a
    group torch created per device (``init_process_group()`` with no backend, as under
    torchrun: ``get_backend()`` says "undefined") its entry in ``get_backend_config()``
    for the accelerator where there is one, else for the CPU."""
    name = dist.get_backend()
    if name == "undefined":
        name = dist.get_backend_config()
    return backend_for_device(name, device_type())


def launch_backend() -> str:
    """The backend a launched job creates its group with: NCCL where this process's
    accelerator is CUDA, else gloo (on the CPU)."""
    return "nccl" if device_type() == "cuda" else "gloo"
