"""The quick tier's samples of the large parametrized tests.

A case is in the sample when a hash of its id falls in one of ``every``
buckets: a fixed sample, stable from run to run, that does not follow the
loops that generated the cases. Every other case is marked ``slow``: the full
suite runs them all, ``-m "not slow"`` only the sample.
"""

from __future__ import annotations

import zlib

import pytest


def in_sample(case_id: str, every: int) -> bool:
    return zlib.crc32(case_id.encode()) % every == 0


def sampled(values, case_id: str, every: int):
    """``pytest.param(*values, id=case_id)`` (a single value need not be a tuple),
    marked ``slow`` unless it is in the sample."""
    values = values if isinstance(values, tuple) else (values,)
    return pytest.param(*values, id=case_id, marks=() if in_sample(case_id, every) else pytest.mark.slow)
