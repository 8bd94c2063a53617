"""Shared pytest setup for the redist_opt test suite.

* Stops at once, naming the install command, when redist_opt (with
  redist_opt.passes) or the test extras are not installed in this Python.
* Initialises the ``fake`` process group once per pytest process (every
  LocalTensorMode-simulated test shares it; each xdist worker is its own
  process, so each has its own).
* Two tiers: ``python -m pytest -q`` runs everything; ``-m "not slow"`` is the
  inner loop. Tests of the modules owned here carry their ``slow`` marks in
  place; ``SLOW`` below marks the heavy tests of the other modules.
* Runs on two xdist workers (``addopts`` in pyproject.toml) with the scheduler
  below: the longest tests first (``FIRST``, most of them start processes),
  a module's tests on one worker where they share an expensive module fixture
  (``UNITS``), and every other test handed out one by one, so that neither
  worker waits for the other at the end.
* Prints, at the end, the number of cases per file, the hypothesis example
  counts and the cases checked against the independent reference, gathered
  from every worker.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = 'pip install -c constraints.txt -e ".[test]"'


def _install_problem() -> str | None:
    """Why this Python cannot run the tests of this checkout, or None."""
    try:
        importlib.metadata.distribution("redist-opt")
    except importlib.metadata.PackageNotFoundError:
        return "the redist-opt package is not installed in this Python"
    for name in ("redist_opt", "redist_opt.passes", "hypothesis", "expecttest", "xdist"):
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            return f"cannot import {name}: {e}"
        if name.startswith("redist_opt") and ROOT not in Path(module.__file__).resolve().parents:
            return f"{name} is imported from {module.__file__}, not from this checkout ({ROOT})"
    return None


def pytest_addoption(parser):
    if importlib.util.find_spec("xdist") is None:
        # Accept pyproject's `-n 2 --dist loadgroup` so that pytest_configure can
        # name the install command instead of argparse rejecting them.
        group = parser.getgroup("xdist missing")
        group._addoption("-n", dest="numprocesses")  # pytest reserves short options for itself
        group.addoption("--dist", dest="dist")


def pytest_configure(config):
    problem = _install_problem()
    if problem is not None:
        raise pytest.UsageError(
            f"{problem}.\nInstall the package and its test extras from {ROOT} first:\n    {INSTALL}"
        )


# The test helpers import redist_opt and torch: they are imported in the hooks
# below, which run only once pytest_configure found the install good.

# ----------------------------------------------------------------------------
# Slow tests of other modules, and tests that start processes
# ----------------------------------------------------------------------------

# node id (or its prefix up to "::name") -> why it is slow. The modules owned by
# the test-suite harness (differential, properties, counts, rank-free) mark their
# own slow cases: a sample of each stays in the quick tier.
SLOW = {
    "tests/test_gloo.py::test_gloo_compiled_tp_mlp_matches_eager": "torch.compile on 4 gloo ranks",
    "tests/test_graph_pass_gloo.py": "compiles programs on 8 and on 4 gloo ranks",
    "tests/test_graph_pass.py::test_inductor_post_grad_custom_post_pass": "Inductor's C++ compile, in a subprocess",
    "tests/test_compile.py::test_inductor_inner_and_default_backend_inside_enabled": "Inductor's C++ compile",
    "tests/test_bench.py::test_calibrate_end_to_end": "calibrates on 4 gloo ranks",
    "tests/test_bench.py::test_bench_end_to_end": "benchmarks on 4 gloo ranks",
    "tests/test_bench.py::test_run_ranks_times_out": "waits for a 10 s timeout",
}

# For the xdist scheduler. UNITS: modules whose tests share a module-scoped
# fixture that is worth running once (it starts processes or runs many cases):
# each is one unit of work, run on one worker. Every other test is a unit of its
# own. FIRST: the longest units and tests, handed out before everything else,
# longest first (seconds on 2 cores, from --durations), so that the two
# workers finish together.
UNITS = (
    "tests/test_graph_pass_gloo.py",
    "tests/test_graph_pass.py",
    "tests/test_bench.py",
    "tests/test_quality.py",
    "tests/test_graph_lowering.py",
    "tests/test_advise_gloo.py",
    "tests/test_graph_pass_semantics.py",
)
FIRST = (
    "tests/test_graph_pass_gloo.py",  # 170 s: 8 and 4 gloo ranks compiling
    "tests/test_graph_pass_semantics.py",  # 150 s: 4 gloo ranks, compiled programs
    "tests/test_graph_lowering.py",  # 145 s: 4 gloo ranks, compiled programs
    "tests/test_graph_pass.py",  # 140 s: a compiling subprocess, Inductor
    "tests/test_gloo.py::test_gloo_compiled_tp_mlp_matches_eager",  # 110 s
    "tests/test_properties.py::test_outputs_equal_oracle",  # 65 s
    "tests/test_bench.py",  # 65 s: gloo ranks
    "tests/test_advise_gloo.py",  # 80 s: 8 gloo ranks, four runs of two steps
    "tests/test_decisions.py::test_one_case_live_on_eight_gloo_ranks",  # 55 s
    "tests/test_calibrate_launch.py::test_launched_calibrate_on_two_hosts_of_two_ranks",  # 40 s
    "tests/test_properties.py::test_plan_never_worse_than_torch",  # 40 s
    "tests/test_compile.py::test_inductor_inner_and_default_backend_inside_enabled",  # 20 s
    "tests/test_gloo.py::test_gloo_2x2_matches_torch",  # 20 s: 4 gloo ranks
    "tests/test_quality.py",  # 15 s
    "tests/test_explain.py::test_cli_error_in_a_real_process",  # 10 s: a fresh interpreter
    "tests/test_rank_free.py::test_plan_without_process_group",  # 10 s: a fresh interpreter
    "tests/test_public_cases.py::test_world_group_used_when_dims_cover_the_world_2x2x2",  # 7 s: a fresh interpreter
    "tests/test_cost_profile.py::test_gloo_mesh_gets_gloo_profile",  # 5 s: gloo ranks
)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _matches(nodeid: str, key: str) -> bool:
    return nodeid == key or nodeid.startswith(key + "::") or nodeid.startswith(key + "[")


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    # A SLOW entry that matches nothing in a module collected whole is stale.
    whole = {_file_of(item.nodeid) for item in items} if not any("::" in a for a in config.args) else set()
    unused = [k for k in SLOW if _file_of(k) in whole]
    for item in items:
        for key, why in SLOW.items():
            if _matches(item.nodeid, key):
                item.add_marker(pytest.mark.slow(reason=why))
                if key in unused:
                    unused.remove(key)
    if unused:
        raise pytest.UsageError(
            "tests/conftest.py SLOW names tests that no longer exist: " + ", ".join(unused)
        )
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the scheduler's queue
        items.sort(key=_first_rank)


def _first_rank(item) -> int:
    return next((i for i, key in enumerate(FIRST) if _matches(item.nodeid, key)), len(FIRST))


def unit_of(nodeid: str) -> str:
    f = _file_of(nodeid)
    return f if f in UNITS else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's load-scope scheduling with the units of ``UNITS``, handed out in
    the workers' collection order (``FIRST`` first); a worker asks for more when
    it has two tests left. (xdist's own ``xdist_group`` marks do not reach its
    scheduler under pytest 9, hence this.)"""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False  # keep the FIRST order, not units by size
    return UnitScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def fake_process_group():
    from support import harness

    harness.ensure_fake_pg()
    yield


# ----------------------------------------------------------------------------
# End-of-run summary, gathered from the xdist workers
# ----------------------------------------------------------------------------

_collected: Counter = Counter()
_outcomes: dict[str, Counter] = {}
_gathered: dict = {}  # run_report.Report.to_dict() of every process, merged


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput"):  # a worker's collection is counted by the controller
        for item in session.items:  # after -k/-m deselection
            _collected[_file_of(item.nodeid)] += 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if not _collected:  # every worker collects the same items
        for nodeid in ids:
            _collected[_file_of(nodeid)] += 1


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _outcomes.setdefault(_file_of(report.nodeid), Counter())[report.outcome] += 1


def _gather(report: dict) -> None:
    for k, v in report.items():
        if isinstance(v, dict):
            mine = _gathered.setdefault(k, Counter())
            mine.update(v)
        else:
            _gathered.setdefault(k, []).extend(v)


def pytest_sessionfinish(session):
    from support import run_report

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["redist_opt_report"] = run_report.REPORT.to_dict()
    else:
        _gather(run_report.REPORT.to_dict())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _gather(getattr(node, "workeroutput", {}).get("redist_opt_report", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    if _collected:
        tr.section("case counts")
        for f in sorted(_collected):
            oc = _outcomes.get(f, Counter())
            detail = ", ".join(f"{v} {k}" for k, v in sorted(oc.items()))
            tr.write_line(f"{f}: {_collected[f]} cases collected" + (f" ({detail})" if detail else ""))
        tr.write_line(f"total: {sum(_collected.values())} cases")
    from support import run_report

    report = run_report.Report()
    report.merge(_gathered)
    for line in report.summary_lines():
        tr.write_line(line)
