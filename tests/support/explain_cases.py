"""The explain fixture cases (``fixtures/cases.json``): their plans and their
``redist-opt explain`` arguments, for the golden, explain and picture tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import redist_opt

ROOT = Path(__file__).resolve().parent.parent.parent
CASES_FILE = ROOT / "fixtures" / "cases.json"


def load_cases() -> dict[str, dict]:
    """The fixture cases by id (fixtures/cases.json)."""
    data = json.loads(CASES_FILE.read_text())
    return {c["id"]: c for c in data["cases"]}


def case_spec(case: dict) -> redist_opt.MeshSpec:
    sizes, names = [], []
    for part in case["mesh"].split(","):
        name, size = part.split("=")
        names.append(name.strip())
        sizes.append(int(size))
    return redist_opt.MeshSpec(sizes=tuple(sizes), names=tuple(names), flattened=tuple(case["flatten"]))


def case_plans(case: dict):
    """(naive, optimized) plans of a fixture case."""
    spec = case_spec(case)
    naive = redist_opt.plan(
        spec, case["src"], case["dst"], shape=tuple(case["shape"]), dtype=getattr(torch, case["dtype"])
    )
    return naive, redist_opt.optimize(naive, groups=case["groups"])


def case_argv(case: dict) -> list[str]:
    """The ``redist-opt explain`` arguments of a fixture case."""
    argv = ["explain", "--mesh", case["mesh"], "--src", case["src"], "--dst", case["dst"]]
    argv += [
        "--shape",
        ",".join(map(str, case["shape"])),
        "--dtype",
        case["dtype"],
        "--groups",
        case["groups"],
    ]
    for f in case["flatten"]:
        argv += ["--flatten", f]
    return argv
