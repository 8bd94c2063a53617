"""Differential tests: redist_opt.redistribute(..., groups="existing") against
torch's DTensor.redistribute with the merge pass disabled, on every simulated
rank (LocalTensorMode over the fake backend). See support/harness.py
(check_case) for what is compared and support/cases.py for how the cases are
generated.

Every case is ``slow`` except a fixed sample of about one in ``SAMPLE_EVERY``
(support/sampling.py), which the quick tier (``-m "not slow"``) runs.
"""

from __future__ import annotations

import pytest
from support.cases import all_cases
from support.harness import run_case
from support.sampling import sampled

# eager against torch, every case; .ci/run runs it on every torch of the range
pytestmark = pytest.mark.differential

CASES = all_cases()
SAMPLE_EVERY = 20


def _params(group):
    return [sampled(c, c.id, SAMPLE_EVERY) for c in CASES[group]]


@pytest.mark.parametrize("case", _params("1d"))
def test_1d_mesh(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("2d"))
def test_2d_mesh(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("3d"))
def test_3d_mesh(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("mesh_variants"))
def test_mesh_variants(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("api"))
def test_api_variants(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("mixed_partials"))
def test_mixed_partials(case):
    run_case(case)


@pytest.mark.parametrize("case", _params("chains"))
def test_chains(case):
    run_case(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES["dtypes"]])
def test_dtypes(case):
    run_case(case)
