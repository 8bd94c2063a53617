"""Pictures: the SVGs parse as SVG and have the documented structure; DOT is well formed."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
from support.explain_cases import case_plans, load_cases

import redist_opt
from redist_opt import ir
from redist_opt.debug import visualize
from redist_opt.ir import layout as L

SVG = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> ET.Element:
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == SVG + "svg"
    for attr in ("width", "height"):
        assert float(re.match(r"[0-9.]+", root.get(attr)).group()) > 0
    return root


def panels(root):
    return [g for g in root.iter(SVG + "g") if g.get("class") == "panel"]


def rank_rects(panel):
    return [r for r in panel.iter(SVG + "rect") if r.get("class") == "rank"]


@pytest.mark.parametrize(
    "case_id",
    ["design1_nonconsecutive_reductions", "design3_uneven_all_gather", "one_dim_mesh", "four_dim_mesh"],
)
def test_mesh_svg_one_rect_per_rank_and_groups_match_rank_lists(case_id):
    naive, optimized = case_plans(load_cases()[case_id])
    mesh = naive.mesh
    root = parse(visualize.mesh_svg(mesh, [("naive", naive), ("optimized", optimized)]))
    ps = panels(root)
    colls = [*naive.collectives(), *optimized.collectives()]
    assert len(ps) == 1 + len(colls)
    for p in ps:
        rects = rank_rects(p)
        assert len(rects) == mesh.num_ranks
        assert sorted(int(r.get("data-rank")) for r in rects) == list(range(mesh.num_ranks))
    for p, c in zip(ps[1:], colls):
        assert c.kind in p.get("data-title")
        members: dict[int, list] = {}
        for r in rank_rects(p):
            members.setdefault(int(r.get("data-group")), []).append(
                (int(r.get("data-position")), int(r.get("data-rank")))
            )
        got = [[rank for _, rank in sorted(v)] for _, v in sorted(members.items())]
        assert got == L.rank_lists(c.group.layout, mesh.index_space)


def test_mesh_svg_small_multiples_for_3d():
    spec = redist_opt.MeshSpec(sizes=(3, 2, 4), names=("x", "y", "z"))
    root = parse(visualize.mesh_svg(spec))
    (p,) = panels(root)
    assert len(rank_rects(p)) == 24
    labels = [t.text for t in p.iter(SVG + "text") if t.text and t.text.startswith("x=")]
    assert labels == ["x=0", "x=1", "x=2"]


def test_mesh_svg_extra_group_panels_and_escaping():
    spec = redist_opt.MeshSpec(sizes=(2, 2), names=("a<b", "c&d"))
    root = parse(visualize.mesh_svg(spec, groups=[("both <dims>", spec.group((0, 1)))]))
    ps = panels(root)
    assert [p.get("data-title") for p in ps][-1] == "both <dims>"
    assert {r.get("data-group") for r in rank_rects(ps[-1])} == {"0"}


def test_mesh_svg_refuses_huge_meshes():
    spec = redist_opt.MeshSpec(sizes=(64, 32))
    with pytest.raises(ValueError, match="2048 ranks"):
        visualize.mesh_svg(spec)


def test_plan_graph_svg_structure():
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    root = parse(visualize.plan_graph_svg([("naive", naive), ("optimized", optimized)]))
    nodes = [g for g in root.iter(SVG + "g") if (g.get("class") or "").startswith("node")]
    for label, plan in (("naive", naive), ("optimized", optimized)):
        mine = [g for g in nodes if g.get("data-plan") == label]
        assert [g.get("data-node") for g in mine] == [n.name for n in plan.graph.graph.nodes]
        assert len([g for g in mine if "collective" in g.get("class")]) == plan.num_collectives
        for g in mine:
            assert len(g.findall(SVG + "rect")) == 1
    edges = [p for p in root.iter(SVG + "path") if (p.get("class") or "").startswith("edge")]
    flow = [p for p in edges if "flow" in p.get("class")]
    assert len(flow) == (len(naive.graph.graph.nodes) - 1) + (len(optimized.graph.graph.nodes) - 1)
    # provenance: one dashed edge per from_node that names a node of the naive plan
    naive_names = {n.name for n in naive.graph.graph.nodes}
    expected = sum(1 for n in optimized.graph.graph.nodes for s in ir.from_nodes(n) if s in naive_names)
    assert len([p for p in edges if "from" in p.get("class")]) == expected


def test_plan_graph_svg_single_plan_and_fallback():
    naive, _ = case_plans(load_cases()["no_op"])
    parse(visualize.plan_graph_svg(naive))
    fb = naive.replace(graph=None, fallback_reason="planned by torch <graph-based>")
    root = parse(visualize.plan_graph_svg([("fb", fb)]))
    assert [g.get("data-op") for g in root.iter(SVG + "g") if g.get("data-op")] == ["fallback"]


def _check_dot(text: str) -> None:
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    declared = set(re.findall(r'^\s*("(?:[^"\\]|\\.)*") \[label=', text, re.M))
    for a, b in re.findall(r'^\s*("(?:[^"\\]|\\.)*") -> ("(?:[^"\\]|\\.)*")', text, re.M):
        assert a in declared and b in declared


@pytest.mark.parametrize("case_id", sorted(load_cases()))
def test_dot_is_well_formed(case_id):
    naive, optimized = case_plans(load_cases()[case_id])
    _check_dot(visualize.plans_to_dot([("naive", naive), ("optimized", optimized)]))
    _check_dot(visualize.plan_to_dot(optimized))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (optional)")
def test_dot_renders_with_graphviz_when_present():
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    text = visualize.plans_to_dot([("naive", naive), ("optimized", optimized)])
    out = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    parse(out.stdout[out.stdout.index("<svg") :])


def test_committed_docs_images_are_svg():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    images = sorted(docs.glob("*.svg"))
    assert images, "docs/ should hold the example images the README links"
    for path in images:
        root = ET.parse(path).getroot()
        assert root.tag == SVG + "svg"
