"""Fault harness: run one program on N gloo ranks under a watchdog, and check what
every rank actually sent.

``run_program(program, world, ...)`` spawns ``world`` processes on 127.0.0.1. Each
rank initialises gloo with the flight recorder on (``TORCH_FR_BUFFER_SIZE``), then
calls ``program(ctx)`` twice: once as the *reference* (``ctx.reference`` is True:
the program is expected to run torch's redistribute with its merge pass off,
``ctx.redistribution()`` does that) and once *optimized* (``ctx.redistribution()``
is ``redist_opt.enabled(...)``). Each call returns a dict of tensors. A rank's
report holds both dicts, the collectives the flight recorder saw (every process
group, in issue order), the global ranks of each group it used, how long each
``ctx.section(name)`` took, and the error (traceback) if the program raised.

The watchdog: every rank runs for at most ``bound_s`` seconds of wall time. A rank
still running then writes every thread's stack (``faulthandler``, which needs no
GIL) and, if it can, its flight-recorder trace, and exits; the parent kills what
is left a few seconds later. A hang is therefore a ``hung`` report with stacks,
never a stuck test.

The checks (pure functions, unit-tested on hand-made traces in
test_fault_harness.py):

* :func:`sequence_mismatches`: within every process group, every member rank that
  reported issued the same collectives (op, sizes, dtypes) in the same order;
* :func:`slow_sections`: no ``ctx.section`` took longer than a bound;
* :func:`output_mismatches`: the optimized outputs equal the reference outputs.

Kept free of pytest imports: spawned children import this module (they find its
folder on the parent's ``sys.path``, which spawn hands down).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import os
import pickle
import tempfile
import threading
import time
import traceback
from collections.abc import Callable

# A ring buffer this long holds every collective of a fault program many times over;
# a wrapped buffer is reported (the comparison would be of partial sequences).
FR_BUFFER_SIZE = 20000
# After the watchdog fired, how long the parent waits for the rank's dump before killing it.
_KILL_GRACE_S = 10.0
# Process start-up and the rendezvous (importing torch on a loaded machine) are not the
# program's time: this much more is allowed for them.
_STARTUP_S = 60.0


# -- what a rank reports ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Collective:
    """One flight-recorder entry, reduced to what must agree across a group's members."""

    group: str  # the process group's name (the same on every member)
    seq: int  # collective_seq_id within that group on this rank (1, 2, ...)
    op: str  # profiling_name, e.g. "gloo:all_reduce"
    input_sizes: tuple
    output_sizes: tuple
    dtypes: tuple

    def describe(self) -> str:
        return (
            f"{self.op} in={list(map(list, self.input_sizes))} "
            f"out={list(map(list, self.output_sizes))} {list(self.dtypes)}"
        )


@dataclasses.dataclass
class RankReport:
    rank: int
    status: str  # "ok" | "error" (the program raised) | "hung" (watchdog) | "died" (no report)
    error: str | None = None
    reference: dict | None = None
    outputs: dict | None = None
    collectives: list = dataclasses.field(default_factory=list)  # [Collective]
    groups: dict = dataclasses.field(default_factory=dict)  # group name -> (global ranks, desc)
    sections: dict = dataclasses.field(default_factory=dict)  # name -> seconds
    agreement_waits: list = dataclasses.field(default_factory=list)  # redist_opt's rounds: (topic, seconds)
    elapsed_s: float | None = None  # the optimized call, start to return or raise
    stacks: str | None = None
    fr_wrapped: bool = False
    exitcode: int | None = None


def collectives_from_fr(trace: dict) -> tuple[list[Collective], bool]:
    """The collectives of a ``_dump_fr_trace()`` dict (unpickled), in record order,
    and whether the ring buffer wrapped (then the oldest entries are lost)."""
    out = []
    entries = trace.get("entries", [])
    for e in entries:
        if e.get("is_p2p"):
            continue
        name = e["process_group"][0]
        out.append(
            Collective(
                group=str(name),
                seq=int(e["collective_seq_id"]),
                op=str(e["profiling_name"]),
                input_sizes=tuple(tuple(s) for s in e.get("input_sizes", ())),
                output_sizes=tuple(tuple(s) for s in e.get("output_sizes", ())),
                dtypes=tuple(e.get("input_dtypes", ())) + tuple(e.get("output_dtypes", ())),
            )
        )
    wrapped = bool(entries) and entries[0].get("record_id", 0) != 0
    return out, wrapped


# -- the checks -------------------------------------------------------------------------


def sequence_mismatches(reports: dict, *, compare_sizes: bool = True) -> list[str]:
    """Every process group whose member ranks (among those that reported a trace)
    did not issue the same collectives in the same order, each named with the first
    position where they differ. ``reports``: {rank: RankReport} (or any object with
    ``collectives`` and ``groups``)."""
    members_of: dict[str, tuple] = {}
    desc_of: dict[str, str] = {}
    problems = []
    for rank, rep in reports.items():
        for name, (ranks, desc) in rep.groups.items():
            ranks = tuple(ranks)
            if name in members_of and members_of[name] != ranks:
                problems.append(
                    f"process group {name!r} has ranks {list(members_of[name])} on some ranks "
                    f"and {list(ranks)} on rank {rank}"
                )
            members_of.setdefault(name, ranks)
            desc_of.setdefault(name, desc)
        for c in rep.collectives:
            if c.group not in rep.groups:
                problems.append(
                    f"rank {rank} ran {c.describe()} in process group {c.group!r} whose ranks it "
                    "did not report"
                )
    for name in sorted(members_of, key=lambda n: (len(n), n)):
        seqs = {
            r: [c for c in reports[r].collectives if c.group == name]
            for r in members_of[name]
            if r in reports
        }
        label = (
            f"process group {name!r} ({desc_of[name] or 'no description'}, ranks {list(members_of[name])})"
        )
        for r, seq in seqs.items():
            ids = [c.seq for c in seq]
            if ids != list(range(ids[0], ids[0] + len(ids))) if ids else False:
                problems.append(f"{label}: rank {r}'s sequence ids are not consecutive: {ids}")
        problem = _first_difference(seqs, compare_sizes)
        if problem:
            problems.append(f"{label}: {problem}")
    return problems


def _key(c: Collective, compare_sizes: bool):
    return (c.op, c.dtypes) + ((c.input_sizes, c.output_sizes) if compare_sizes else ())


def _first_difference(seqs: dict, compare_sizes: bool) -> str | None:
    if len(seqs) < 2:
        return None
    longest = max(len(s) for s in seqs.values())
    for i in range(longest):
        at = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
        keys = {r: (_key(c, compare_sizes) if c is not None else None) for r, c in at.items()}
        if len(set(keys.values())) > 1:
            parts = []
            for r, c in at.items():
                parts.append(
                    f"rank {r} ran {c.describe()}"
                    if c is not None
                    else f"rank {r} ran nothing (its sequence ends after {len(seqs[r])})"
                )
            return f"collective #{i + 1} differs: " + "; ".join(parts)
    return None


def slow_sections(reports: dict, bound_s: float, names=None) -> list[str]:
    """Every ``ctx.section`` (of ``names``, default all) that took longer than ``bound_s``."""
    out = []
    for rank, rep in sorted(reports.items()):
        for name, s in rep.sections.items():
            if (names is None or name in names) and s > bound_s:
                out.append(f"rank {rank}: section {name!r} took {s:.2f} s (bound {bound_s:g} s)")
    return out


def output_mismatches(reports: dict) -> list[str]:
    """Every output of a rank that finished both runs and differs from its reference
    (exactly, or within float tolerance for floating tensors)."""
    import torch

    out = []
    for rank, rep in sorted(reports.items()):
        if rep.outputs is None or rep.reference is None:
            continue
        if set(rep.outputs) != set(rep.reference):
            out.append(f"rank {rank}: outputs {sorted(rep.outputs)} but reference {sorted(rep.reference)}")
            continue
        for name, want in rep.reference.items():
            got = rep.outputs[name]
            try:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            except AssertionError as e:
                out.append(
                    f"rank {rank}: output {name!r} differs from the reference: {str(e).splitlines()[0]}"
                )
    return out


def worst_wait(reports: dict, names=None) -> float:
    """The longest ``ctx.section`` (of ``names``) over all ranks, in seconds."""
    return max(
        (s for rep in reports.values() for n, s in rep.sections.items() if names is None or n in names),
        default=0.0,
    )


def worst_agreement_wait(reports: dict) -> float:
    """The longest wait of a rank in one of redist_opt's agreement rounds, in seconds."""
    return max((s for rep in reports.values() for _, s in rep.agreement_waits), default=0.0)


def assert_consistent(
    reports: dict, *, bound_s: float | None = None, outputs: bool = True, expect_ok: bool = True
) -> None:
    """Raise AssertionError naming every problem: a rank not ok (when ``expect_ok``),
    mismatched collective sequences, a section over ``bound_s``, outputs off."""
    problems = []
    if expect_ok:
        for rank, rep in sorted(reports.items()):
            if rep.status != "ok":
                problems.append(f"rank {rank} {rep.status}:\n{(rep.error or rep.stacks or '').rstrip()}")
    problems += sequence_mismatches(reports)
    if bound_s is not None:
        problems += slow_sections(reports, bound_s)
    if outputs:
        problems += output_mismatches(reports)
    for rank, rep in sorted(reports.items()):
        if rep.fr_wrapped:
            problems.append(f"rank {rank}: the flight recorder's buffer wrapped (raise FR_BUFFER_SIZE)")
    if problems:
        raise AssertionError("\n".join(problems))


# -- the rank side ----------------------------------------------------------------------


class Context:
    """What a program gets: its rank, the world, its args, and the switches between
    the reference run and the optimized one."""

    def __init__(self, rank: int, world: int, args: tuple, options: dict, reference: bool, sections: dict):
        self.rank, self.world, self.args = rank, world, args
        self.options = options
        self.reference = reference
        self._sections = sections

    def redistribution(self, **overrides):
        """torch's redistribute with its merge pass off (reference run), or
        ``redist_opt.enabled(**options)`` (optimized run)."""
        if self.reference:
            from torch.distributed.tensor._redistribute import disable_redistribute_transform_optimization

            return disable_redistribute_transform_optimization()
        import redist_opt

        return redist_opt.enabled(**{**self.options, **overrides})

    @contextlib.contextmanager
    def section(self, name: str):
        """Time the block (optimized run only) as ``name``: a wait the test bounds."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            if not self.reference:
                self._sections[name] = self._sections.get(name, 0.0) + time.monotonic() - t0


def _group_table(names) -> dict:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    table = {}
    for name in names:
        try:
            pg = c10d._resolve_process_group(name)
            table[name] = (tuple(dist.get_process_group_ranks(pg)), pg.group_desc)
        except Exception:  # a group destroyed since: leave it out (reported as unknown)
            pass
    return table


def _snapshot(report: RankReport) -> None:
    import torch

    trace = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    report.collectives, report.fr_wrapped = collectives_from_fr(trace)
    report.groups = _group_table({c.group for c in report.collectives})
    try:
        from redist_opt.runtime import consensus
    except ImportError:  # a redist_opt without run-time agreement
        return
    report.agreement_waits = list(consensus.WAITS)


def _write(path: str, report: RankReport) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(report, f)
    os.replace(tmp, path)


def _rank_main(
    rank: int,
    program: Callable,
    world: int,
    port: int,
    args: tuple,
    options: dict,
    env: dict,
    rank_env: dict,
    bound_s: float,
    pg_timeout_s: float,
    out_dir: str,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE=str(FR_BUFFER_SIZE)
    )
    os.environ.update(env)
    os.environ.update(rank_env.get(rank, {}))
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # Until the ranks have met the watchdog allows start-up time too; from then on the
    # program's budget: a rank that started late gets the same budget as its peers.
    deadline = time.monotonic() + _STARTUP_S + bound_s
    report = RankReport(rank, "hung")
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    stack_file = open(os.path.join(out_dir, f"rank{rank}.stacks"), "w")
    faulthandler.dump_traceback_later(bound_s, exit=False, file=stack_file)
    written = threading.Lock()  # the first of the main thread and the watchdog reports

    def finish(status: str, exitcode: int) -> None:
        if not written.acquire(blocking=False):
            if threading.current_thread() is threading.main_thread():
                threading.Event().wait()  # the watchdog reports and exits
            return
        report.status = status
        try:
            _snapshot(report)
        except Exception:
            report.error = (report.error or "") + "\nflight recorder dump failed:\n" + traceback.format_exc()
        _write(path, report)
        # Stay up until every rank reported (or the budget is spent): a rank that
        # exits closes its gloo connections, which would turn its peers' hang in a
        # collective it never issued into an error, unlike a job whose ranks go on.
        # No destroy_process_group: a rank whose peers are gone would block in it.
        # Counted from now: every peer's budget restarted when the ranks met, before
        # this rank finished, so its watchdog fires within bound_s of now; the grace
        # covers a late firing on a loaded machine.
        _wait_for_reports(out_dir, world, time.monotonic() + bound_s + _KILL_GRACE_S)
        os._exit(exitcode)

    def watchdog():
        while (left := deadline - time.monotonic()) > 0:  # read each turn: moved once the ranks meet
            time.sleep(min(left, 0.5))
        # The main thread may hold the GIL in C++ for good: the parent kills us then.
        report.elapsed_s = report.elapsed_s or bound_s
        finish("hung", 3)

    threading.Thread(target=watchdog, daemon=True).start()
    status = "error"
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=pg_timeout_s)
        )
        deadline = time.monotonic() + bound_s
        report.reference = program(Context(rank, world, args, options, True, report.sections))
        t0 = time.monotonic()
        try:
            report.outputs = program(Context(rank, world, args, options, False, report.sections))
        finally:
            report.elapsed_s = time.monotonic() - t0
        status = "ok"
    except BaseException:
        report.error = traceback.format_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        finish(status, 0)


def _wait_for_reports(out_dir: str, world: int, deadline: float) -> None:
    paths = [os.path.join(out_dir, f"rank{r}.pkl") for r in range(world)]
    while time.monotonic() < deadline and not all(map(os.path.exists, paths)):
        time.sleep(0.05)


def run_program(
    program: Callable,
    world: int,
    *,
    args: tuple = (),
    options: dict | None = None,
    env: dict | None = None,
    rank_env: dict | None = None,
    bound_s: float = 60.0,
    pg_timeout_s: float | None = None,
) -> dict[int, RankReport]:
    """Run ``program(ctx)`` (a module-level function) on ``world`` gloo ranks; {rank: report}.

    ``options``: what ``ctx.redistribution()`` passes to ``redist_opt.enabled``.
    ``env`` is set on every rank, ``rank_env[r]`` on rank ``r`` only, before gloo
    starts. ``bound_s`` is each rank's wall-time budget (watchdog); ``pg_timeout_s``
    gloo's collective timeout (default: above the budget, so a hang is caught by the
    watchdog with stacks rather than by gloo).
    """
    import torch.multiprocessing as mp
    from torch.distributed.elastic.utils.distributed import get_free_port

    pg_timeout_s = pg_timeout_s if pg_timeout_s is not None else bound_s + 30.0
    with tempfile.TemporaryDirectory(prefix="fault_harness_") as out_dir:
        pc = mp.start_processes(
            _rank_main,
            args=(
                program,
                world,
                get_free_port(),
                args,
                options or {},
                env or {},
                rank_env or {},
                bound_s,
                pg_timeout_s,
                out_dir,
            ),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + _STARTUP_S + bound_s + _KILL_GRACE_S
        for p in pc.processes:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in pc.processes:
            if p.is_alive():
                p.kill()
                p.join(5.0)
        reports = {}
        for rank, p in enumerate(pc.processes):
            path = os.path.join(out_dir, f"rank{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    rep = pickle.load(f)
            else:
                rep = RankReport(
                    rank, "died", error=f"rank {rank} exited with code {p.exitcode} without a report"
                )
            rep.exitcode = p.exitcode
            stacks = os.path.join(out_dir, f"rank{rank}.stacks")
            if rep.status in ("hung", "died") and os.path.exists(stacks):
                with open(stacks) as f:
                    rep.stacks = f.read() or None
            reports[rank] = rep
    return reports
