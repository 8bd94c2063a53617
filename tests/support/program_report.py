"""The JSON report a test program prints, and its test reads back.

A program run as a subprocess prints its report with :func:`emit`, which then leaves
without the interpreter's teardown: threads Inductor started can abort a process there
("terminate called without an active exception", exit -6) after its work is done and
its report written, which would fail a test whose program did everything right.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

MARK = "JSON"


def emit(report) -> NoReturn:
    """Print ``report`` after :data:`MARK` and leave, skipping the interpreter's teardown."""
    print(MARK + json.dumps(report), flush=True)
    sys.stderr.flush()
    os._exit(0)


def read(returncode: int, stdout: str, stderr: str) -> dict:
    """The report a program printed; its stderr's tail when it failed or printed none."""
    assert returncode == 0 and MARK in stdout, stderr[-4000:]
    return json.loads(stdout[stdout.index(MARK) + len(MARK) :])
