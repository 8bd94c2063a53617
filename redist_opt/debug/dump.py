"""Dumps of plans: text and per-pass dump files.

Text
----
:func:`format_plan` (what ``str(plan)`` prints): the request, one line per
collective (kind, reduce op, group as dim names and CuTe layout, bytes in per
rank), the passes that changed the plan and their notes, then the IR, one op a
line, with provenance (``# <- %a, %b``: the nodes a pass rewrote into this one).

explain
-------
The ``redist-opt explain`` report (text and JSON) is in :mod:`redist_opt.debug.explain`.

Per-pass dumps
--------------
Like XLA's ``--xla_dump_to``: :func:`write_pass_dump` writes
``NNNN.<pipeline>.before_pipeline.{txt,dot}`` and
``NNNN.<pipeline>.after_<pass-name>.{txt,dot}``; the pipeline calls it before
the first pass and after each pass that changed the IR, when
:func:`dump_dir_from_env` names a directory (``REDIST_OPT_DUMP_DIR``).
``REDIST_OPT_DUMP_PASSES`` is an optional regex: only passes whose name it
matches (``re.search``) are dumped (``before_pipeline`` always is). ``diff`` two
consecutive ``.txt`` files to see what a pass did.

In a multi-rank run (torch.distributed initialized with world size > 1) every
dump file name carries the rank, ``NNNN.<pipeline>.rankR.<stage>``, so ranks
writing to one directory do not overwrite each other; :func:`rank_suffix` is the
one helper every dump writer (the compiled-graph pass and backend too) uses.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import torch.distributed as dist

from redist_opt.ir.placements import placement_str
from redist_opt.ir.text import dtype_str as _dtype_str
from redist_opt.ir.text import format_graph, format_plan
from redist_opt.torch_api.dtensor import process_rank

__all__ = [
    "format_plan",
    "format_graph",
    "write_pass_dump",
    "pass_dump_writer",
    "dump_dir_from_env",
    "dump_pass_filter_from_env",
    "pass_selected",
    "plan_tag",
    "rank_suffix",
    "DUMP_DIR_ENV",
    "DUMP_PASSES_ENV",
]

DUMP_DIR_ENV = "REDIST_OPT_DUMP_DIR"
DUMP_PASSES_ENV = "REDIST_OPT_DUMP_PASSES"


# -- plain plan dumps ------------------------------------------------------------


def dump_dir_from_env() -> Path | None:
    """The directory named by ``REDIST_OPT_DUMP_DIR``, or None when unset or empty."""
    value = os.environ.get(DUMP_DIR_ENV, "").strip()
    return Path(value) if value else None


def dump_pass_filter_from_env() -> re.Pattern | None:
    """The compiled ``REDIST_OPT_DUMP_PASSES`` regex, or None when unset or empty."""
    value = os.environ.get(DUMP_PASSES_ENV, "")
    if not value:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError(f"{DUMP_PASSES_ENV}={value!r} is not a valid regular expression: {e}") from None


def pass_selected(pass_name: str | None) -> bool:
    """True when ``pass_name`` should be dumped under ``REDIST_OPT_DUMP_PASSES``."""
    stage = _stage(pass_name)
    if stage == "before_pipeline":
        return True
    pattern = dump_pass_filter_from_env()
    return pattern is None or pattern.search(stage[len("after_") :]) is not None


def _stage(pass_name: str | None) -> str:
    if pass_name in (None, "", "before_pipeline"):
        return "before_pipeline"
    if pass_name.startswith("after_"):
        return pass_name
    return f"after_{pass_name}"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def plan_tag(plan) -> str:
    """A file-name-safe tag naming a plan's request, e.g. ``a2-b2-c2_P-P-P_to_R-S0-R_8x4_float32``.

    For ``pipeline=`` in :func:`write_pass_dump` when one process dumps many plans
    (library use): without it every plan's ``0000.default.before_pipeline.txt``
    would overwrite the last one's.
    """

    def pl(p) -> str:
        return re.sub(r"[^A-Za-z0-9]", "", placement_str(p))

    mesh = "-".join(f"{plan.mesh.dim_name(d)}{s}" for d, s in enumerate(plan.mesh.sizes))
    src = "-".join(pl(p) for p in plan.src)
    dst = "-".join(pl(p) for p in plan.dst)
    shape = "x".join(map(str, plan.shape)) or "scalar"
    return _UNSAFE.sub("_", f"{mesh}_{src}_to_{dst}_{shape}_{_dtype_str(plan.dtype)}")


def rank_suffix() -> str:
    """``".rankR"`` when torch.distributed is initialized with world size > 1, else ``""``:
    the part of every dump file name that keeps ranks from overwriting each other."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # a plain int: under LocalTensorMode torch 2.15's dist.get_rank() is a SymInt
        return f".rank{process_rank()}"
    return ""


def pass_dump_writer(dump_dir, plan):
    """The ``on_change`` callback of ``pipeline.run_pipeline`` that dumps ``plan``'s run
    into ``dump_dir`` (default ``$REDIST_OPT_DUMP_DIR``): ``NNNN.default_<plan_tag>.<stage>``
    files before the pipeline and after every pass that changed the plan. None when
    there is no directory."""
    directory = dump_dir_from_env() if dump_dir is None else Path(dump_dir)
    if directory is None:
        return None
    seq = itertools.count()
    pipeline_name = f"default_{plan_tag(plan)}"

    def on_change(pass_name, snapshot) -> None:
        write_pass_dump(directory, next(seq), pipeline_name, pass_name, snapshot)

    return on_change


def write_pass_dump(directory, seq: int, pipeline: str, pass_name: str | None, plan) -> list[Path]:
    """Write ``NNNN.<pipeline>[.rankR].<stage>.txt`` and ``.dot`` for ``plan``; return the paths.

    ``pass_name`` is the kebab-case pass name (the stage is ``after_<pass_name>``),
    or ``None`` / ``"before_pipeline"`` for the IR before the first pass.
    Returns ``[]`` (writes nothing) for a pass ``REDIST_OPT_DUMP_PASSES`` filters out.
    The ``.txt`` is :func:`format_plan`; the ``.dot`` is the IR graph.
    """
    if not pass_selected(pass_name):
        return []
    stage = _stage(pass_name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{int(seq):04d}.{_UNSAFE.sub('_', pipeline)}{rank_suffix()}.{_UNSAFE.sub('_', stage)}"
    txt = directory / f"{stem}.txt"
    dot = directory / f"{stem}.dot"
    txt.write_text(format_plan(plan) + "\n", encoding="utf-8")
    from redist_opt.debug.dot import plan_to_dot  # the renderer loads with the first dump only

    dot.write_text(plan_to_dot(plan, name=stem), encoding="utf-8")
    return [txt, dot]
