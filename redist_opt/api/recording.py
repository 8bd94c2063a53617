"""``redist_opt.record()``: what redistributions one training step issues, to advise on.

``with redist_opt.record() as rec:`` around one step routes it through redist_opt
(as :func:`redist_opt.enabled`, whose options it takes) and keeps every
redistribution that reaches the routed function: the mesh (sizes, dim names, its
dims' layouts in the root's rank space, the root's sizes and names, the flattened
groups that exist), src, dst, global shape, dtype and the call site, with a count
per distinct key. Under ``torch.compile`` the routed function runs while
AOTAutograd traces (``redist_opt.backend()`` or ``enabled()`` around the compile),
so a compiled step is recorded when it is traced: record the step that compiles.

``rec.save("step.json")`` writes the :data:`RECORD_FORMAT` schema::

    {"format": "redist_opt.record/1",
     "ranks": [0],                       # ranks whose records these are
     "world_size": 8,                    # null without a process group
     "meshes": [{"sizes": [2, 2, 2], "names": ["dp", "cp", "tp"],
                 "dim_layouts": [[[2], [4]], [[2], [2]], [[2], [1]]],  # [shape, stride] each
                 "index_space": 8, "backend": "gloo", "ranks_ascending": true,
                 "existing": [[[4], [2]], [[8], [1]]],  # layouts of the multi-dim groups that exist
                 "root": {"sizes": [8], "names": ["world"]},
                 # the root's flattened meshes (``_flatten``), the only groups torch's
                 # merge pass looks up ("existing" also has the world group and root dims)
                 "flattened": [{"name": "dp_cp", "root_dims": null, "layout": [[4], [2]]}]}],
     "redistributions": [{"mesh": 0, "src": "P,P,S(1)", "dst": "R,R,S(1)",
                          "shape": [16, 8], "dtype": "float32",
                          "site": {"label": "backward MmBackward0 aten.mm.default @ train.py:40",
                                   "phase": "backward", "op": "aten.mm.default", "module": null,
                                   "autograd_node": "MmBackward0", "file": "train.py",
                                   "line": 40, "function": "step"},
                          "count": 2, "ranks": [0],
                          "torch_only": null}]}     # or why torch's planner ran it

Each rank records its own step; ``Recording.merge(paths)`` (also
``redist_opt.record.merge``) joins records: equal meshes become one, and a
redistribution recorded on several ranks keeps the largest count any rank saw
(every rank of a collective issues it: counts are per step, not per rank).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.fx.traceback as fx_traceback

from redist_opt.api import advice
from redist_opt.api.advice import layout_json, mesh_record_of_spec
from redist_opt.api.errors import warn_once
from redist_opt.api.routing import OBSERVERS, enabled
from redist_opt.api.specs import spec_of
from redist_opt.ir import layout as L
from redist_opt.ir.placements import RedistributeError, placement_str
from redist_opt.torch_api import dtensor as tdt
from redist_opt.torch_api import mesh as tm
from redist_opt.torch_api.version import TorchAPIError

__all__ = ["RECORD_FORMAT", "Recording", "record", "call_site"]

RECORD_FORMAT = "redist_opt.record/1"

# Frames in these folders and files are not the user's call site.
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, sys.modules["redist_opt"])
)
_SKIP_FILES = frozenset(os.path.abspath(m.__file__) for m in (contextlib, functools, threading))


def _mesh_record(device_mesh, spec) -> dict:
    root = tm.root_mesh(device_mesh)
    root_names = list(root.mesh_dim_names) if root.mesh_dim_names else None
    flattened = []
    for name, flat, dims in L.flattened_dims(tm.internals(device_mesh)):
        named = None if dims is None else [root_names[d] if root_names else d for d in dims]
        layout = L.collapsed_layout(flat)
        flattened.append({"name": name, "root_dims": named, "layout": layout_json(layout)})
    return mesh_record_of_spec(spec, {"sizes": list(root.shape), "names": root_names}, flattened)


def _user_frame(frame):
    """The innermost frame outside torch, redist_opt and generated code, or None."""
    while frame is not None:
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        if not name.startswith("<") and not path.startswith(_SKIP_DIRS) and path not in _SKIP_FILES:
            return frame
        frame = frame.f_back
    return None


def _traced_location(meta: dict) -> tuple[str, int, str] | None:
    """(file, line, function) of the user code a traced graph node came from."""
    trace = meta.get("stack_trace") or ""
    for line in reversed(trace.strip().splitlines()):
        line = line.strip()
        if line.startswith('File "'):
            try:
                file, rest = line[6:].split('", line ', 1)
                lineno, _, func = rest.partition(", in ")
                return os.path.basename(file), int(lineno), func.strip()
            except ValueError:
                return None
    return None


def call_site(frame) -> dict:
    """Where a redistribution comes from: forward/backward, the op DTensor dispatched,
    the autograd node running, the module, and the user's file and line."""
    node = tdt.running_autograd_node()
    meta = fx_traceback.get_current_meta() or {}
    site = {
        "phase": "forward" if node is None else "backward",
        "op": tdt.dispatched_op(frame),
        "autograd_node": node,
        "module": None,
        "file": None,
        "line": None,
        "function": None,
    }
    stack = meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        site["module"] = (
            f"{getattr(kind, '__name__', kind)} ({path})" if path else str(getattr(kind, "__name__", kind))
        )
    traced = _traced_location(meta)
    user = _user_frame(frame)
    if traced is not None:
        site["file"], site["line"], site["function"] = traced
    elif user is not None:
        site["file"] = os.path.basename(user.f_code.co_filename)
        site["line"], site["function"] = user.f_lineno, user.f_code.co_name
        owner = user.f_locals.get("self")
        if site["module"] is None and isinstance(owner, torch.nn.Module):
            site["module"] = type(owner).__name__
    what = site["op"] or site["autograd_node"] or "redistribute"
    if site["phase"] == "backward" and site["autograd_node"] and site["op"]:
        what = f"{site['autograd_node']} {site['op']}"
    where = f"{site['file']}:{site['line']}" if site["file"] else "?"
    module = f" in {site['module']}" if site["module"] else ""
    phase = "backward " if site["phase"] == "backward" else ""
    site["label"] = f"{phase}{what}{module} @ {where}"
    return site


def _placements(placements) -> str:
    """``"P,P,S(1)"``: what ``redist_opt.plan`` reads back."""
    return ",".join(placement_str(p) for p in placements)


def _shape_json(spec) -> list:
    return [int(s) if not isinstance(s, torch.SymInt) else str(s) for s in spec.shape]


class Recording:
    """The redistributions of one step (see the module docstring for the file schema)."""

    def __init__(self, meshes=None, redistributions=None, ranks=None, world_size=None):
        self.meshes: list[dict] = list(meshes or [])
        self.redistributions: list[dict] = list(redistributions or [])
        self.ranks: list[int] = list(ranks or [])
        self.world_size: int | None = world_size
        self._mesh_index: dict = {}  # (spec, root id) -> index into meshes (while recording)
        self._keys: dict = {}  # key -> index into redistributions

    # -- while recording ------------------------------------------------------------
    def _observe(self, local_tensor, current_spec, target_spec, torch_only) -> None:
        try:
            self._note(local_tensor, current_spec, target_spec, torch_only)
        except TorchAPIError:  # a private torch name that moved: loud, as everywhere
            raise
        except Exception as e:  # noqa: BLE001 - a recording must never break the step it records
            what = f"{type(e).__name__}: {e}"
            warn_once(("record", what), f"redist_opt.record: a redistribution was not recorded ({what})")

    def _note(self, local_tensor, current_spec, target_spec, torch_only) -> None:
        if tdt.traced_without_graph(local_tensor):
            return  # repeated example-value / metadata runs of a compile: not in the step
        mesh = current_spec.mesh
        spec = spec_of(mesh)
        mkey = (spec, id(tm.root_mesh(mesh)))
        index = self._mesh_index.get(mkey)
        if index is None:
            index = self._add_mesh(_mesh_record(mesh, spec))
            self._mesh_index[mkey] = index
        site = call_site(sys._getframe(3))
        entry = {
            "mesh": index,
            "src": _placements(current_spec.placements),
            "dst": _placements(target_spec.placements),
            "shape": _shape_json(current_spec),
            "dtype": str(local_tensor.dtype).removeprefix("torch."),
            "site": site,
            "count": 1,
            "ranks": list(self.ranks),
            "torch_only": torch_only,
        }
        self._add(entry, combine=lambda old, new: old + new)

    def _add_mesh(self, mesh: dict) -> int:
        for i, m in enumerate(self.meshes):
            if m == mesh:
                return i
        self.meshes.append(mesh)
        return len(self.meshes) - 1

    @staticmethod
    def _key(entry: dict) -> tuple:
        return (
            entry["mesh"],
            entry["src"],
            entry["dst"],
            tuple(entry["shape"]),
            entry["dtype"],
            entry["site"]["label"],
        )

    def _add(self, entry: dict, combine) -> None:
        key = self._key(entry)
        index = self._keys.get(key)
        if index is None:
            self._keys[key] = len(self.redistributions)
            self.redistributions.append(entry)
            return
        old = self.redistributions[index]
        old["count"] = combine(old["count"], entry["count"])
        old["ranks"] = sorted(set(old["ranks"]) | set(entry["ranks"]))

    # -- files ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": RECORD_FORMAT,
            "ranks": list(self.ranks),
            "world_size": self.world_size,
            "meshes": self.meshes,
            "redistributions": self.redistributions,
        }

    def save(self, path) -> None:
        """Write the recording as JSON (schema :data:`RECORD_FORMAT`)."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_dict(cls, data: dict) -> Recording:
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            fmt = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise RedistributeError(f"not a redist_opt recording: format {fmt!r} is not {RECORD_FORMAT!r}")
        rec = cls(ranks=data.get("ranks"), world_size=data.get("world_size"))
        index = [rec._add_mesh(m) for m in data["meshes"]]
        for entry in data["redistributions"]:
            rec._add(dict(entry, mesh=index[entry["mesh"]]), combine=lambda old, new: old + new)
        return rec

    @classmethod
    def load(cls, path) -> Recording:
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise RedistributeError(f"recording {os.fspath(path)!r} is not valid JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def merge(cls, records: Iterable) -> Recording:
        """One recording of several ranks' (paths, dicts or Recordings): meshes deduplicated,
        each redistribution's count the largest any rank recorded."""
        out = cls()
        for r in records:
            if not isinstance(r, Recording):
                r = cls.from_dict(r) if isinstance(r, dict) else cls.load(r)
            out.ranks = sorted(set(out.ranks) | set(r.ranks))
            out.world_size = out.world_size or r.world_size
            index = [out._add_mesh(m) for m in r.meshes]
            for entry in r.redistributions:
                out._add(dict(entry, mesh=index[entry["mesh"]], ranks=list(entry["ranks"])), combine=max)
        return out

    # -- advice -----------------------------------------------------------------------
    def advise(self, max_new_groups: int = 1, *, cost=None, cost_source: str = "given") -> advice.Advice:
        """Which at most ``max_new_groups`` flattened groups to create (see
        :func:`redist_opt.api.advice.advise`); ``cost``: a CostModel (default: the
        profile of each recorded mesh's backend, as ``optimize`` picks it)."""
        return advice.advise(
            self.meshes,
            self.redistributions,
            max_new_groups=max_new_groups,
            cost=cost,
            cost_source=cost_source,
        )

    def __repr__(self) -> str:
        calls = sum(e["count"] for e in self.redistributions)
        return (
            f"Recording({len(self.redistributions)} distinct redistributions, "
            f"{calls} calls, ranks {self.ranks})"
        )


class _RecordBlock:
    """The context manager :func:`record` returns: routes through redist_opt and records."""

    def __init__(self, groups, options):
        self._enabled = enabled(groups, **options)
        self.recording: Recording | None = None

    def __enter__(self) -> Recording:
        rank = tdt.process_rank()  # a plain int (torch 2.15's LocalTensorMode makes get_rank() a SymInt)
        world = dist.get_world_size() if dist.is_initialized() else None
        self.recording = Recording(ranks=[rank], world_size=world)
        self._enabled.__enter__()
        OBSERVERS.append(self.recording._observe)
        return self.recording

    def __exit__(self, *exc):
        OBSERVERS.remove(self.recording._observe)
        return self._enabled.__exit__(*exc)


def record(groups="existing", **options) -> _RecordBlock:
    """``with redist_opt.record() as rec:`` records the redistributions of the block
    (routed through redist_opt as ``enabled(groups, **options)`` routes them)."""
    return _RecordBlock(groups, options)


record.merge = Recording.merge
record.load = Recording.load
