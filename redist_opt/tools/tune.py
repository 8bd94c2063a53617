"""``redist-opt tune FILE.py:FUNCTION --out PROFILE``: :func:`redist_opt.tune` on a job's
``make_step`` factory, one process per rank (torchrun). What tuning does:
:mod:`redist_opt.measure.tuning`."""

from __future__ import annotations

import importlib
import os
import runpy
from collections.abc import Callable

import torch.distributed as dist

from redist_opt.measure import format_result, tune
from redist_opt.tools.args import CliError

__all__ = ["load_factory", "cmd_tune"]


def load_factory(target: str) -> Callable:
    """``FILE.py:NAME`` or ``package.module:NAME``: the job's ``make_step`` factory."""
    location, sep, name = target.rpartition(":")
    if not sep or not location or not name.isidentifier():
        raise CliError(f"{target!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION (the make_step factory)")
    if location.endswith(".py"):
        if not os.path.isfile(location):
            raise CliError(f"{target!r}: no file {location!r}")
        # as ``python FILE`` would run it, but not as __main__ (its main() does not run)
        namespace = runpy.run_path(location, run_name="__redist_opt_tune__")
    else:
        try:
            namespace = vars(importlib.import_module(location))
        except ImportError as e:
            raise CliError(f"{target!r}: cannot import {location!r}: {e}") from None
    factory = namespace.get(name)
    if not callable(factory):
        raise CliError(f"{target!r}: {location} has no function {name!r}")
    return factory


def cmd_tune(args) -> int:
    """``redist-opt tune FILE.py:FUNCTION --out PROFILE``, one process per rank (torchrun)."""
    created = not dist.is_initialized()
    if created:
        if "RANK" not in os.environ:
            raise CliError(
                "no process group and no torchrun environment: run it as "
                "`torchrun --nproc_per_node=N -m redist_opt tune FILE.py:FUNCTION --out PROFILE`"
            )
        dist.init_process_group()  # env:// with torch's default backend per device (gloo, nccl)
    try:
        factory = load_factory(args.step)
        compiler = None if args.compiler == "eager" else args.compiler
        result = tune(
            factory,
            args.out,
            compiler=compiler,
            rounds=args.rounds,
            warmup=args.warmup,
            memory_rounds=args.memory_rounds,
            base=args.base,
            groups=args.groups,
            route_outside_compiled=not args.compiled_region_only,
        )
        if dist.get_rank() == 0:
            print(format_result(result), flush=True)
    finally:
        if created:
            dist.destroy_process_group()
    return 0
