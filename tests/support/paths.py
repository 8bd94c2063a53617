"""Where the checkout and the support scripts are, for tests that start a
subprocess (``cwd=ROOT``, ``PYTHONPATH=ROOT``) or run a support module as a
script. The test files live one folder below tests/, so they do not compute
these from their own ``__file__``."""

import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))  # tests/support
ROOT = os.path.dirname(os.path.dirname(SUPPORT))  # the checkout: redist_opt/, fixtures/, docs/, examples/
