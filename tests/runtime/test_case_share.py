"""``--case-share K/N`` (tests/conftest.py, support/sampling.py): the shares of the exhaustive
cases that .ci/run gives the other torch releases of the range partition them, and the quick
tier's sample is in every share."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.cases import all_cases
from support.paths import ROOT
from support.sampling import in_sample, in_share, parse_share

IDS = [c.id for group in all_cases().values() for c in group]


def test_shares_partition_the_cases_evenly():
    for shares in (2, 3):
        counts = [sum(in_share(i, k, shares) for i in IDS) for k in range(shares)]
        assert sum(counts) == len(IDS)
        assert min(counts) > 0.9 * len(IDS) / shares, counts


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "1/0"])
def test_bad_share_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="--case-share"):
        parse_share(text)


def _collected(*args: str) -> set[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-n",
            "0",
            "tests/runtime/test_differential.py",
            "-k",
            "test_1d_mesh or test_dtypes",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line for line in out.splitlines() if "::" in line}


def _case_id(nodeid: str) -> str:
    return nodeid.split("[", 1)[1][:-1]


@pytest.mark.slow
def test_collection_keeps_one_share_and_the_sample():
    every = _collected()
    halves = [_collected("--case-share", f"{k}/2") for k in range(2)]
    both = halves[0] & halves[1]
    assert halves[0] | halves[1] == every
    # the quick tier's sample, and test_dtypes (every case quick), stay in both shares
    assert {n for n in every if in_sample(_case_id(n), 20)} <= both
    assert all(in_sample(_case_id(n), 20) or "::test_dtypes[" in n for n in both)
    # each other case is in the one share its hash names
    for k, half in enumerate(halves):
        assert all(in_share(_case_id(n), k, 2) for n in half - both)
