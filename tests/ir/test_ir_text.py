"""The IR text round-trips: ``parse_ir(format_ir(p))`` prints as ``p`` and behaves as
``p`` under every pass, on every fixture case (naive and optimized plans) and on
generated plans."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.ir_text import assert_round_trips, run

import redist_opt
from redist_opt.ir.layout_algebra import FlatLayout
from redist_opt.ir.parse import IRParseError, parse_ir
from redist_opt.ir.text import format_graph, format_ir
from redist_opt.passes import DEFAULT_PIPELINE
from redist_opt.pipeline import run_pipeline

CASES = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "cases.json").read_text())["cases"]


def _spec(case) -> redist_opt.MeshSpec:
    pairs = [part.split("=") for part in case["mesh"].split(",")]
    return redist_opt.MeshSpec(
        sizes=tuple(int(s) for _, s in pairs),
        names=tuple(n for n, _ in pairs),
        flattened=tuple(case["flatten"]),
    )


def _plans(case):
    naive = redist_opt.plan(
        _spec(case), case["src"], case["dst"], shape=tuple(case["shape"]), dtype=getattr(torch, case["dtype"])
    )
    return naive, redist_opt.optimize(naive, groups=case["groups"])


def check_same_under_every_pass(plan, groups="existing") -> None:
    """The parsed plan prints the same, and every pass (and the pipeline) does the same to it."""
    text = format_ir(plan)
    parsed = parse_ir(text)
    assert format_ir(parsed) == text
    assert format_graph(parsed) == format_graph(plan)
    assert parsed.collectives() == plan.collectives()
    for cls in DEFAULT_PIPELINE:
        ours = run(text, cls, groups=groups)
        theirs = run_pipeline(plan, groups=groups, passes=[cls])
        assert ours.text == format_ir(theirs.replace(notes=(), applied_passes=())), cls.name
        assert ours.notes == tuple(str(n) for n in theirs.notes), cls.name
    a = run_pipeline(parsed, groups=groups)
    b = run_pipeline(plan, groups=groups)
    assert format_ir(a) == format_ir(b) and a.notes == b.notes and a.applied_passes == b.applied_passes


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_fixture_case_round_trips(case):
    naive, optimized = _plans(case)
    check_same_under_every_pass(naive, case["groups"])
    check_same_under_every_pass(optimized, case["groups"])


# Plans whose optimized IR has every step field: variants and avg_scale.
VARIANT_PLANS = [
    # (mesh sizes, flattened, src, dst, shape, groups, the field it shows)
    ((2, 8), [], "S(0),S(1)", "R,R", (5, 7), "create", "variant=gather_blocks(0: a, 1: b)"),
    ((2, 4, 2), [], "S(0),S(1),S(0)", "R,R,R", (9, 7), "create", "variant=gather_blocks(0: a+c, 1: b)"),
    (
        (2, 3),
        ["a+b"],
        "S(0),S(0)",
        "S(1),S(2)",
        (5, 3, 7),
        "existing",
        "variant=split_all_to_all(1: a, 2: b)",
    ),
    ((2, 3), ["a+b"], "P(avg),P", "R,R", (8, 4), "existing", "avg_scale=2"),
    ((2, 2), ["a+b"], "P,P(avg)", "S(0),S(0)", (5, 3), "existing", "avg_scale=2"),
]


@pytest.mark.parametrize("sizes, flat, src, dst, shape, groups, field", VARIANT_PLANS)
def test_step_variants_round_trip(sizes, flat, src, dst, shape, groups, field):
    spec = redist_opt.MeshSpec(sizes=sizes, names=tuple("abc"[: len(sizes)]), flattened=flat)
    naive = redist_opt.plan(spec, src, dst, shape=shape)
    optimized = redist_opt.optimize(naive, groups=groups)
    assert field in format_ir(optimized)
    check_same_under_every_pass(optimized, groups)


PLACEMENTS = ["R", "S(0)", "S(1)", "P", "P(avg)", "P(max)"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    data=st.data(),
)
def test_generated_plans_round_trip(sizes, data):
    nd = len(sizes)
    names = tuple("abc"[:nd])
    src = data.draw(st.lists(st.sampled_from(PLACEMENTS), min_size=nd, max_size=nd))
    dst = data.draw(st.lists(st.sampled_from(["R", "S(0)", "S(1)"]), min_size=nd, max_size=nd))
    shape = tuple(data.draw(st.lists(st.integers(0, 7), min_size=2, max_size=2)))
    flat = ["+".join(names)] if nd > 1 and data.draw(st.booleans()) else []
    spec = redist_opt.MeshSpec(sizes=tuple(sizes), names=names, flattened=flat)
    try:
        naive = redist_opt.plan(spec, ",".join(src), ",".join(dst), shape=shape)
    except ValueError:
        return  # a transition DTensor does not support
    groups = data.draw(st.sampled_from(["existing", "create"]))
    check_same_under_every_pass(naive, groups)
    check_same_under_every_pass(redist_opt.optimize(naive, groups=groups), groups)


def test_mesh_facts_round_trip():
    # a column-major mesh with a backend, a flattened group given by layout, unnamed dims
    spec = redist_opt.MeshSpec(
        (2, 4),
        None,
        flattened=(FlatLayout((4, 2), (2, 1)),),
        dim_layouts=(FlatLayout((2,), (1,)), FlatLayout((4,), (2,))),
        backend="gloo",
    )
    p = redist_opt.plan(spec, "S(0),S(1)", "R,R", shape=(5, 7))
    text = format_ir(p)
    assert text.splitlines()[1] == "mesh flattened=[8:1] backend=gloo layouts=[2:1, 4:2]"
    parsed = parse_ir(text)
    assert parsed.mesh.dim_layouts == spec.dim_layouts and parsed.mesh.backend == "gloo"
    assert parsed.mesh.flattened_layouts == spec.flattened_layouts
    check_same_under_every_pass(p, "create")


def test_preserve_rank_order_round_trips():
    # torch 2.15's DeviceMesh(preserve_rank_order=True): groups keep the layout's rank order
    spec = redist_opt.MeshSpec((2, 2), ("a", "b"), preserve_rank_order=True)
    text = format_ir(redist_opt.plan(spec, "S(0),S(1)", "R,R", shape=(4, 4)))
    assert text.splitlines()[1] == "mesh preserve_rank_order=True"
    parsed = parse_ir(text)
    assert parsed.mesh.preserve_rank_order and parsed.mesh == spec
    plain = format_ir(
        redist_opt.plan(redist_opt.MeshSpec((2, 2), ("a", "b")), "S(0),S(1)", "R,R", shape=(4, 4))
    )
    assert "preserve_rank_order" not in plain


def test_hand_written_text_may_leave_shapes_out():
    text = """\
redistribute [P, P] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
%x : (8, 4)
step 0 over b: P -> R, logical=(8, 4)
  %all_reduce = all_reduce(%x, {b 2:1}, 'sum')
return %all_reduce
"""
    assert format_ir(parse_ir(text)).splitlines()[3].endswith(": (8, 4)")


@pytest.mark.parametrize(
    "line, message",
    [
        ("  %all_reduce = all_reduce(%x, {b 2:2}, 'sum') : (8, 4)", "have layout 2:1, not 2:2"),
        ("  %all_reduce = all_reduce(%x, {b 2:1}, 'sum') : (4, 4)", "derived"),
        ("  %all_reduce = all_reduce(%x, {d 2:1}, 'sum') : (8, 4)", "no dim named 'd'"),
        ("  %all_reduce = all_raduce(%x, {b 2:1}, 'sum') : (8, 4)", "unknown op 'all_raduce'"),
        ("  %all_reduce = pad_to(%x, 0, 4*c_z) : (8, 4)", "c_z"),
    ],
)
def test_bad_text_names_the_line(line, message):
    text = f"""\
redistribute [P, P] -> [R, R] on mesh (a=2,b=2), shape (8, 4), float32
%x : (8, 4)
step 0 over b: P -> R, logical=(8, 4)
{line}
return %all_reduce
"""
    with pytest.raises(IRParseError, match="line 4") as e:
        parse_ir(text)
    assert message in str(e.value)


def test_printer_output_is_canonical():
    naive, optimized = _plans(CASES[0])
    assert_round_trips(format_ir(optimized))


def _pass_test_texts() -> list[tuple[str, str]]:
    """Every IR text literal (inputs and expected outputs) of the pass test files."""
    out = []
    for path in sorted((Path(__file__).resolve().parents[1] / "passes").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for i, text in enumerate(node.value.split("\n\n")):  # joined outputs
                    if text.startswith("redistribute ["):
                        out.append((f"{path.stem}:{node.lineno}:{i}", text))
    return out


PASS_TEST_TEXTS = _pass_test_texts()


def test_pass_test_texts_are_found():
    assert len({name.split(":")[0] for name, _ in PASS_TEST_TEXTS}) >= 9, PASS_TEST_TEXTS  # one file per pass


@pytest.mark.parametrize("text", [t for _, t in PASS_TEST_TEXTS], ids=[i for i, _ in PASS_TEST_TEXTS])
def test_pass_test_texts_round_trip(text):
    assert_round_trips(text)
