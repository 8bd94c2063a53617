"""The graph pass's cache key (``RedistGraphPass.uuid()``) covers every decision:
fresh processes sharing one Inductor cache directory hit each other's entries only
when the code and the cost profile they would rewrite with are the same.

Each process compiles a small function with ``RedistGraphPass`` as Inductor's
post-grad pass (``tests/support/cache_key_programs.py``). Inductor keys a compile on
the graph before the pass runs, so a key that misses a decision serves a stale
rewrite: a hit after another ``REDIST_OPT_COST_PROFILE``, or after a pass changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from support.paths import ROOT, SUPPORT
from support.program_report import read as read_report

PROGRAM = os.path.join(SUPPORT, "cache_key_programs.py")


def _compile(cache_dir, *, tree=ROOT, profile=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "REDIST_OPT_COST_PROFILE"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), PYTHONPATH=str(tree))
    if profile is not None:
        env["REDIST_OPT_COST_PROFILE"] = profile
    proc = subprocess.run(
        [sys.executable, PROGRAM], capture_output=True, text=True, timeout=600, env=env, cwd=str(tree)
    )
    report = read_report(proc.returncode, proc.stdout, proc.stderr)
    assert report["package"] == os.path.join(str(tree), "redist_opt"), report  # the tree meant
    assert not report["bypass"], report  # the pass's uuid lets the compile be cached
    return report


def _hit(report) -> bool:
    assert report["hit"] + report["miss"] == 1, report  # one graph: a hit or a miss
    return report["hit"] == 1


@pytest.mark.slow  # five processes, two Inductor C++ compiles
def test_cache_hits_only_with_the_same_code_and_cost_profile(tmp_path):
    cache = tmp_path / "inductor"
    assert not _hit(_compile(cache))
    assert _hit(_compile(cache))  # the same code and profile: the entry is served
    assert not _hit(_compile(cache, profile="gloo"))  # another profile prices chains otherwise

    # A copy of the package (passes/ is a symlinked folder; copied as files): the same
    # code at another path hits; after one pass file changes, it misses.
    tree = tmp_path / "tree"
    shutil.copytree(
        os.path.join(ROOT, "redist_opt"), tree / "redist_opt", ignore=shutil.ignore_patterns("__pycache__")
    )
    assert _hit(_compile(cache, tree=tree))
    with open(tree / "redist_opt" / "passes" / "merge_reductions.py", "a") as f:
        f.write("\n# a change to a pass: its rewrites may differ\n")
    assert not _hit(_compile(cache, tree=tree))


def _key_with_flattened(*order: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "group_order_key_program.py"), *order],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_job_that_flattens_in_another_order_gets_another_key():
    """The rewritten graph names process groups, which c10d names in creation order: a
    job creating the same flattened meshes in another order must not load a graph whose
    names mean other groups (or none) there. The key holds the names."""
    first = _key_with_flattened("a+b", "b+c")
    again = _key_with_flattened("a+b", "b+c")
    swapped = _key_with_flattened("b+c", "a+b")
    assert first["names"] == again["names"] and first["key"] == again["key"]  # a restart hits
    assert swapped["names"]["a+b"] != first["names"]["a+b"]  # the same layout, another name
    assert swapped["key"] != first["key"]
