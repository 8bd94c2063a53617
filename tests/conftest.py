"""Shared pytest setup for the redist_opt test suite.

* Stops at once, naming the install command, when redist_opt (with
  redist_opt.passes) or the test extras are not installed in this Python.
* Initialises the ``fake`` process group once per pytest process (every
  LocalTensorMode-simulated test shares it; each xdist worker is its own
  process, so each has its own).
* Two tiers: ``python -m pytest -q`` runs everything; ``-m "not slow"`` is the
  inner loop. Slow tests (over about 10 s, or starting process groups) carry
  ``@pytest.mark.slow`` (or a module's ``pytestmark``) where they are defined.
* Runs on two xdist workers with xdist's ``loadgroup`` scheduling (``addopts``
  in pyproject.toml): a module whose tests share an expensive module fixture
  marks itself ``xdist_group`` and runs on one worker; every other test is
  handed out singly, so that neither worker waits for the other at the end.
  The queue is the workers' collection order (``--no-loadscope-reorder``),
  which ``pytest_collection_modifyitems`` sorts long units first by folder and
  marker (``_long_first``); no test is named here.
* ``--case-share K/N`` keeps one share of the exhaustive cases (marker
  ``exhaustive``, support/sampling.py) and deselects the rest: .ci/run gives
  each torch of the range other than 2.13.0 one share (docs/ci.md).
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
    parser.addoption(
        "--case-share",
        metavar="K/N",
        default=None,
        help="keep share K (0-based) of N of the exhaustive cases (marker 'exhaustive', "
        "support/sampling.py) and deselect the others; .ci/run gives each torch of the range but "
        "2.13.0 one share",
    )
    if importlib.util.find_spec("xdist") is None:
        # Accept pyproject's `-n 2 --dist loadgroup --no-loadscope-reorder` so that
        # pytest_configure can name the install command instead of argparse
        # rejecting them.
        group = parser.getgroup("xdist missing")
        group._addoption("-n", dest="numprocesses")  # pytest reserves short options for itself
        group.addoption("--dist", dest="dist")
        group.addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false")


def pytest_configure(config):
    problem = _install_problem()
    if problem is not None:
        raise pytest.UsageError(
            f"{problem}.\nInstall the package and its test extras from {ROOT} first:\n    {INSTALL}"
        )


# The test helpers import redist_opt and torch: they are imported in the hooks
# below, which run only once pytest_configure found the install good.

# ----------------------------------------------------------------------------
# Scheduling: long units first, by folder and marker (no test names here)
# ----------------------------------------------------------------------------


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _long_first(item) -> tuple[bool, bool, bool]:
    """Sort key of a worker's queue (False sorts first): tests that start
    process groups (tests/multiproc), then the other slow tests, then the
    modules kept on one worker by ``xdist_group`` (they share an expensive
    module fixture), then everything else, each in collection order."""
    return (
        item.path.parent.name != "multiproc",
        item.get_closest_marker("slow") is None,
        item.get_closest_marker("xdist_group") is None,
    )


def _keep_share(config, items) -> None:
    """Deselects the exhaustive cases outside ``--case-share K/N`` (every process, controller
    and workers alike, selects the same items)."""
    text = config.getoption("--case-share")
    if text is None:
        return
    from support.sampling import in_share, parse_share

    try:
        share, shares = parse_share(text)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    keep, drop = [], []
    for item in items:
        out = item.get_closest_marker("exhaustive") is not None and not in_share(
            item.callspec.id, share, shares
        )
        (drop if out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    _keep_share(config, items)
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the scheduler's queue
        items.sort(key=_long_first)


@pytest.fixture(scope="session", autouse=True)
def fake_process_group():
    from support import meshes

    meshes.ensure_fake_pg()
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
