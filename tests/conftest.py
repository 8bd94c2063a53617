"""Shared pytest setup for the redist_opt test-suite.

* Initialises the ``fake`` process group once per pytest process (all
  LocalTensorMode-simulated tests share it; WORLD_SIZE covers the largest mesh).
* Makes the repository root importable (``import redist_opt``) and this folder
  (``import harness``) regardless of how pytest is invoked.
* Prints the number of collected cases per file at the end of the run.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import harness

_collected: Counter = Counter()
_outcomes: dict[str, Counter] = {}


@pytest.fixture(scope="session", autouse=True)
def fake_process_group():
    harness.ensure_fake_pg()
    yield


def pytest_collection_finish(session):
    for item in session.items:  # after -k/-m deselection
        _collected[item.location[0]] += 1


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _outcomes.setdefault(report.location[0], Counter())[report.outcome] += 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _collected:
        return
    tr = terminalreporter
    tr.section("case counts")
    for f in sorted(_collected):
        oc = _outcomes.get(f, Counter())
        detail = ", ".join(f"{v} {k}" for k, v in sorted(oc.items()))
        tr.write_line(f"{f}: {_collected[f]} cases collected" + (f" ({detail})" if detail else ""))
    tr.write_line(f"total: {sum(_collected.values())} cases")
    if harness.ORACLE_ARTIFACTS:
        tr.write_line(
            f"{len(harness.ORACLE_ARTIFACTS)} case(s) where torch failed inside the "
            "LocalTensorMode simulation were checked against the independent reference:"
        )
        for a in harness.ORACLE_ARTIFACTS:
            tr.write_line(f"  {a}")
