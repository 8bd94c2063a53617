"""The quick tier's samples of the large parametrized tests, and the shares of
their exhaustive rest that the other torch releases of the range run.

A case is in the sample when a hash of its id falls in one of ``every``
buckets: a fixed sample, stable from run to run, that does not follow the
loops that generated the cases. Every other case is marked ``slow`` and
``exhaustive``: the full suite runs them all, ``-m "not slow"`` only the sample.

``--case-share K/N`` (tests/conftest.py) keeps share K of N of the
``exhaustive`` cases and deselects the others, by a second hash of the id,
independent of the sample's. .ci/run runs every case on torch 2.13.0 (the full
suite) and gives each other release of the range one share of two, alternating
over the releases in order, so that every case also runs on two of them
(docs/ci.md says why).
"""

from __future__ import annotations

import zlib

import pytest


def in_sample(case_id: str, every: int) -> bool:
    return zlib.crc32(case_id.encode()) % every == 0


def in_share(case_id: str, share: int, shares: int) -> bool:
    """Whether the case is in share ``share`` (0-based) of ``shares``."""
    return zlib.crc32(f"share:{case_id}".encode()) % shares == share


def parse_share(text: str) -> tuple[int, int]:
    """``"K/N"`` as (K, N), with 0 <= K < N; a ValueError naming the text otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--case-share {text!r}: expected K/N, two integers such as 0/2") from None
    if not 0 <= k < n:
        raise ValueError(f"--case-share {text!r}: K must be in 0..N-1")
    return k, n


def sampled(values, case_id: str, every: int):
    """``pytest.param(*values, id=case_id)`` (a single value need not be a tuple),
    marked ``slow`` and ``exhaustive`` unless it is in the sample."""
    values = values if isinstance(values, tuple) else (values,)
    marks = () if in_sample(case_id, every) else (pytest.mark.slow, pytest.mark.exhaustive)
    return pytest.param(*values, id=case_id, marks=marks)
