"""Collective combining (``redist_opt.graph.combine``): graph text in, graph text out.

Small fx graphs are built by hand from funcol collectives + ``wait_tensor`` nodes
whose values are fake tensors (as in a compiled graph); group names are plain
strings, priced by a stub: every collective costs 1 unit plus 1 unit per
``BYTES_PER_UNIT`` bytes fed in, so a combined one stays latency-bound
(legality 4) up to ``BYTES_PER_UNIT`` bytes. Each legality condition has a twin
the pass leaves as it was; the ``test_values_*`` tests run the rewritten graph
against the original with the collectives simulated.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from expecttest import TestCase
from support.graph_builder import C10D, GraphBuilder
from torch._subclasses.fake_tensor import FakeTensorMode

from redist_opt.graph.combine import MAX_HOISTED, combine_collectives

aten = torch.ops.aten
BYTES_PER_UNIT = 1024


def stub_time(kind, group, nbytes):
    return None if group == "unpriced" else 1.0 + nbytes / BYTES_PER_UNIT


def G() -> GraphBuilder:
    return GraphBuilder("combined", lambda graph: combine_collectives(graph, stub_time))


class TestCombine(TestCase):
    def test_two_gathers_of_inputs_become_one(self):
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (2, 3))
        wa = g.ag(a)
        use = g.call(aten.mul.Tensor, wa, wa)
        wb = g.ag(b)
        self.assertExpectedInline(
            g.text(use, wb),
            """\
# combined: 1
view = view.default(a, [-1])
view_1 = view.default(b, [-1])
cat = cat.default([view, view_1])
all_gather_into_tensor = all_gather_into_tensor.default(cat, 2, '7')
wait_tensor = wait_tensor.default(all_gather_into_tensor)
view_2 = view.default(wait_tensor, [2, -1])
split_with_sizes = split_with_sizes.default(view_2, [4, 6], 1)
getitem = getitem(split_with_sizes, 0)
getitem_1 = getitem(split_with_sizes, 1)
view_3 = view.default(getitem, [2, 4])
clone = clone.default(view_3, memory_format=torch.contiguous_format)
view_4 = view.default(clone, [8])
view_5 = view.default(getitem_1, [2, 2, 3])
clone_1 = clone.default(view_5, memory_format=torch.contiguous_format)
view_6 = view.default(clone_1, [4, 3])
mul_tensor = mul.Tensor(view_4, view_4)
return [mul_tensor, view_6]""",
        )

    def test_three_gathers_combine_while_latency_bound(self):
        # 3 x 256 B in: the set of all three is 768 B, within the stub's 1024 B bound
        g = G()
        xs = [g.x(f"p{i}", (64,)) for i in range(3)]
        outs = [g.ag(x) for x in xs]
        text = g.text(*outs)
        self.assertIn("# combined: 2", text)
        self.assertEqual(text.count("all_gather_into_tensor.default"), 1)

    def test_not_combined_past_the_latency_bound(self):
        # legality 4: 2 x 768 B in is past 1024 B; the third (256 B) joins the earliest
        # set it fits, the first
        g = G()
        a, b, c = g.x("a", (192,)), g.x("b", (192,)), g.x("c", (64,))
        text = g.text(g.ag(a), g.ag(b), g.ag(c))
        self.assertIn("# combined: 1", text)
        self.assertIn("all_gather_into_tensor.default(b, 2, '7')", text)
        self.assertIn("cat.default([view, view_1])\nall_gather", text)
        self.assertIn("view_1 = view.default(c, [-1])", text)

    def test_unpriced_group_is_not_combined(self):
        # legality 4: a group the cost model cannot price
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,))
        text = g.text(g.ag(a, "unpriced"), g.ag(b, "unpriced"))
        self.assertIn("# combined: 0", text)

    def test_different_groups_sizes_and_dtypes_are_not_combined(self):
        # legality 2
        g = G()
        a, b, c, d = g.x("a", (4,)), g.x("b", (4,)), g.x("c", (4,), torch.float64), g.x("d", (4,))
        text = g.text(g.ag(a, "7"), g.ag(b, "8"), g.ag(c, "7"), g.ag(d, "7", n=4))
        self.assertIn("# combined: 0", text)

    def test_input_computed_after_the_first_gather_is_not_combined(self):
        # legality 3: b depends on a's gathered value, so it cannot be gathered with a
        g = G()
        a = g.x("a", (4,))
        wa = g.ag(a)
        b = g.call(aten.mul.Tensor, wa, 2.0)
        self.assertExpectedInline(
            g.text(g.ag(b)),
            """\
# combined: 0
all_gather_into_tensor_default = all_gather_into_tensor.default(a, 2, '7')
wait_tensor_default = wait_tensor.default(all_gather_into_tensor_default)
mul_tensor = mul.Tensor(wait_tensor_default, 2.0)
all_gather_into_tensor_default_1 = all_gather_into_tensor.default(mul_tensor, 2, '7')
wait_tensor_default_1 = wait_tensor.default(all_gather_into_tensor_default_1)
return wait_tensor_default_1""",
        )

    def test_late_input_starts_a_new_set(self):
        # legality 3: c is computed after the first gather: it starts a set of its own,
        # and d (ready early) joins the first
        g = G()
        a, b, d = g.x("a", (4,)), g.x("b", (4,)), g.x("d", (4,))
        wa = g.ag(a)
        c = g.call(aten.mul.Tensor, b, 2.0)
        wc, wd = g.ag(c), g.ag(d)
        text = g.text(wa, wc, wd)
        self.assertIn("# combined: 1", text)
        self.assertIn("all_gather_into_tensor.default(mul_tensor, 2, '7')", text)
        self.assertIn("view_1 = view.default(d, [-1])", text)

    def test_view_of_an_early_value_moves_up(self):
        # legality 3: b's input is a view of an input, traced just before its gather
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (2, 2))
        wa = g.ag(a)
        vb = g.call(aten.view.default, b, [4])
        self.assertExpectedInline(
            g.text(wa, g.ag(vb)),
            """\
# combined: 1
view_default = view.default(b, [4])
view = view.default(a, [-1])
view_1 = view.default(view_default, [-1])
cat = cat.default([view, view_1])
all_gather_into_tensor = all_gather_into_tensor.default(cat, 2, '7')
wait_tensor = wait_tensor.default(all_gather_into_tensor)
view_2 = view.default(wait_tensor, [2, -1])
split_with_sizes = split_with_sizes.default(view_2, [4, 4], 1)
getitem = getitem(split_with_sizes, 0)
getitem_1 = getitem(split_with_sizes, 1)
view_3 = view.default(getitem, [2, 4])
clone = clone.default(view_3, memory_format=torch.contiguous_format)
view_4 = view.default(clone, [8])
view_5 = view.default(getitem_1, [2, 4])
clone_1 = clone.default(view_5, memory_format=torch.contiguous_format)
view_6 = view.default(clone_1, [8])
return [view_4, view_6]""",
        )

    def test_long_view_chain_is_not_moved(self):
        # legality 3: more than MAX_HOISTED views after the first gather
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,))
        wa = g.ag(a)
        v = b
        for _ in range(MAX_HOISTED + 1):
            v = g.call(aten.view.default, v, [4])
        self.assertIn("# combined: 0", g.text(wa, g.ag(v)))

    def test_symbolic_sizes_are_not_combined(self):
        # legality 1: a dynamic-shape graph's sizes are symbols
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        g = G()
        g.mode = FakeTensorMode(shape_env=ShapeEnv())
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
        xs = []
        for name in "ab":
            n = g.graph.placeholder(name)
            n.meta["val"] = g.mode.from_tensor(torch.empty(4), symbolic_context=dynamic)
            xs.append(n)
        self.assertIn("# combined: 0", g.text(g.ag(xs[0]), g.ag(xs[1])))

    def test_uneven_gather_is_not_combined(self):
        # legality 5: an uneven shard's gathered value is narrowed (on every rank)
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,))
        wa = g.ag(a)
        narrowed = g.call(aten.slice.Tensor, wa, 0, 0, 7)
        self.assertIn("# combined: 0", g.text(narrowed, g.ag(b)))

    def test_gather_with_a_second_user_is_not_combined(self):
        # legality 1: the collective's value is used by more than its wait
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,))
        ag = g.call(C10D.all_gather_into_tensor.default, a, 2, "7")
        wa = g.call(C10D.wait_tensor.default, ag)
        other = g.call(aten.mul.Tensor, ag, 2.0)
        text = g.text(wa, other, g.ag(b))
        self.assertIn("# combined: 0", text)

    def test_cast_used_only_by_the_gather_is_not_combined(self):
        # legality 1: Inductor's bucketing folds such casts; this pass leaves them
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,), torch.float64)
        cast = g.call(torch.ops.prims.convert_element_type.default, b, torch.float32)
        text = g.text(g.ag(a), g.ag(cast))
        self.assertIn("# combined: 0", text)

    def test_values(self):
        # The rewritten graph computes what the original did, with all_gather simulated:
        # rank r's block is its input + 100 r.
        g = G()
        a, b, c = g.x("a", (3,)), g.x("b", (2, 3)), g.x("c", (1, 2, 2))
        outs = [g.ag(a, n=4), g.ag(b, n=4), g.ag(c, n=4)]
        g.graph.output(tuple(outs))
        before = fx.GraphModule(torch.nn.Module(), _copy(g.graph))
        self.assertEqual(sum(x.removed for x in combine_collectives(g.graph, stub_time)), 2)
        after = fx.GraphModule(torch.nn.Module(), g.graph)
        inputs = [torch.arange(3.0), torch.arange(6.0).reshape(2, 3), torch.arange(4.0).reshape(1, 2, 2)]
        want, got = _Simulated(before).run(*inputs), _Simulated(after).run(*inputs)
        for w, o in zip(want, got, strict=True):
            self.assertEqual(w.shape, o.shape)
            self.assertTrue(torch.equal(w, o))


class TestCombineReductions(TestCase):
    def test_reduce_scatters_combine_where_the_last_one_was(self):
        # two gradients reduce-scattered one by one, both results used at the end
        g = G()
        a, b = g.x("a", (4, 2)), g.x("b", (2, 3))
        c1 = g.call(C10D.reduce_scatter_tensor.default, g.call(aten.mul.Tensor, a, 2.0), "sum", 2, "7")
        gb = g.call(aten.mul.Tensor, b, 3.0)
        c2 = g.call(C10D.reduce_scatter_tensor.default, gb, "sum", 2, "7")
        self.assertExpectedInline(
            g.text(g.wait(c1), g.wait(c2)),
            """\
# combined: 1
mul_tensor = mul.Tensor(a, 2.0)
mul_tensor_1 = mul.Tensor(b, 3.0)
view = view.default(mul_tensor, [2, -1])
view_1 = view.default(mul_tensor_1, [2, -1])
cat = cat.default([view, view_1], 1)
view_2 = view.default(cat, [14])
reduce_scatter_tensor = reduce_scatter_tensor.default(view_2, 'sum', 2, '7')
wait_tensor = wait_tensor.default(reduce_scatter_tensor)
split_with_sizes = split_with_sizes.default(wait_tensor, [4, 3])
getitem = getitem(split_with_sizes, 0)
getitem_1 = getitem(split_with_sizes, 1)
view_3 = view.default(getitem, [2, 2])
view_4 = view.default(getitem_1, [1, 3])
return [view_3, view_4]""",
        )

    def test_waits_sink_to_the_first_use(self):
        # the reduced values are waited for at once but used only at the end
        g = G()
        a, b = g.x("a", (4,)), g.x("b", (4,))
        wa = g.ar(a)
        gb = g.call(aten.mul.Tensor, b, 3.0)
        wb = g.ar(gb)
        self.assertExpectedInline(
            g.text(g.call(aten.add.Tensor, wa, wb)),
            """\
# combined: 1
mul_tensor = mul.Tensor(b, 3.0)
view = view.default(a, [-1])
view_1 = view.default(mul_tensor, [-1])
cat = cat.default([view, view_1])
all_reduce = all_reduce.default(cat, 'sum', '7')
wait_tensor = wait_tensor.default(all_reduce)
split_with_sizes = split_with_sizes.default(wait_tensor, [4, 4])
getitem = getitem(split_with_sizes, 0)
getitem_1 = getitem(split_with_sizes, 1)
view_2 = view.default(getitem, [4])
view_3 = view.default(getitem_1, [4])
add_tensor = add.Tensor(view_2, view_3)
return add_tensor""",
        )

    def test_reduction_used_before_the_last_is_not_combined(self):
        # legality 3: a's reduced value is used to compute b
        g = G()
        a = g.x("a", (4, 2))
        wa = g.ar(a)
        b = g.call(aten.mul.Tensor, wa, 2.0)
        self.assertIn("# combined: 0", g.text(wa, g.ar(b)))

    def test_reduction_of_a_reduced_value_is_not_combined(self):
        # legality 3: the second all_reduce reads the first one's value
        g = G()
        a = g.x("a", (4,))
        self.assertIn("# combined: 0", g.text(g.ar(g.ar(a))))

    def test_uneven_scatter_is_not_combined(self):
        # legality 5: an uneven shard's scatter input is padded (on every rank)
        g = G()
        a, b = g.x("a", (3, 2)), g.x("b", (4, 2))
        padded = g.call(aten.constant_pad_nd.default, a, [0, 0, 0, 1])
        c1 = g.call(C10D.reduce_scatter_tensor.default, padded, "sum", 2, "7")
        c2 = g.call(C10D.reduce_scatter_tensor.default, b, "sum", 2, "7")
        self.assertIn("# combined: 0", g.text(g.wait(c1), g.wait(c2)))

    def test_all_reduces_combine(self):
        g = G()
        a, b, c = g.x("a", (4,)), g.x("b", (2, 2)), g.x("c", (3,))
        c1 = g.call(C10D.all_reduce.default, a, "sum", "7")
        c2 = g.call(C10D.all_reduce.default, b, "sum", "7")
        c3 = g.call(C10D.all_reduce.default, c, "sum", "7")
        text = g.text(g.wait(c1), g.wait(c2), g.wait(c3))
        self.assertIn("# combined: 2", text)
        self.assertEqual(text.count("all_reduce.default"), 1)

    @staticmethod
    def _two_all_reduces(shape, ops=("sum", "sum")) -> str:
        """The combined graph's text of two all_reduces over group "7" of inputs of ``shape``."""
        g = G()
        cs = [g.call(C10D.all_reduce.default, g.x(name, shape), op, "7") for name, op in zip("ab", ops)]
        return g.text(*(g.wait(c) for c in cs))

    def test_different_reduce_ops_are_not_combined(self):
        # legality 2
        self.assertIn("# combined: 0", self._two_all_reduces((4,), ("sum", "avg")))

    def test_reductions_past_the_latency_bound_are_not_combined(self):
        # legality 4: 2 x 768 B in; the same two at 16 B each are combined
        self.assertIn("# combined: 0", self._two_all_reduces((192,)))
        self.assertIn("# combined: 1", self._two_all_reduces((4,)))

    def test_values_reduce_scatter_and_all_reduce(self):
        g = G()
        a, b, c, d = g.x("a", (4, 3)), g.x("b", (8,)), g.x("c", (3,)), g.x("d", (2, 2))
        # the waits after every collective (legality 3)
        cs = [
            g.call(C10D.reduce_scatter_tensor.default, a, "sum", 4, "7"),
            g.call(C10D.reduce_scatter_tensor.default, b, "sum", 4, "7"),
            g.call(C10D.all_reduce.default, c, "avg", "8"),
            g.call(C10D.all_reduce.default, d, "avg", "8"),
        ]
        outs = [g.wait(x) for x in cs]
        g.graph.output(tuple(outs))
        before = fx.GraphModule(torch.nn.Module(), _copy(g.graph))
        self.assertEqual(sum(x.removed for x in combine_collectives(g.graph, stub_time)), 2)
        after = fx.GraphModule(torch.nn.Module(), g.graph)
        inputs = [
            torch.arange(12.0).reshape(4, 3),
            torch.arange(8.0),
            torch.arange(3.0),
            torch.arange(4.0).reshape(2, 2),
        ]
        want, got = _Simulated(before).run(*inputs), _Simulated(after).run(*inputs)
        for w, o in zip(want, got, strict=True):
            self.assertEqual(w.shape, o.shape)
            self.assertTrue(torch.equal(w, o))


def _copy(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


class _Simulated(fx.Interpreter):
    """Collectives of a group of ``n`` ranks as rank 1 sees them, rank r's input
    being this input + 100 r."""

    def call_function(self, target, args, kwargs):
        if target is C10D.all_gather_into_tensor.default:
            x, n, _ = args
            return torch.cat([x + 100 * r for r in range(n)])
        if target is C10D.reduce_scatter_tensor.default:
            x, op, n, _ = args
            return sum(x + 100 * r for r in range(n)).chunk(n)[1]
        if target is C10D.all_reduce.default:
            x, op, _ = args
            total = sum(x + 100 * r for r in range(4))
            return total / 4 if op == "avg" else total
        if target is C10D.wait_tensor.default:
            return args[0]
        return super().call_function(target, args, kwargs)
