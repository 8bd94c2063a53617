"""All-reduce reassociation (``redist_opt.graph.reassociate``): graph text in, graph text out.

Small fx graphs are built by hand from funcol ``all_reduce`` + ``wait_tensor`` +
``add``/``sub`` nodes (group names are plain strings: the pass never resolves
them); each legality condition has a twin the pass leaves as it was.
"""

from __future__ import annotations

import torch
from expecttest import TestCase
from support.graph_builder import GraphBuilder

from redist_opt.graph.reassociate import reassociate_all_reduces

aten = torch.ops.aten


def G() -> GraphBuilder:
    return GraphBuilder("reassociated", reassociate_all_reduces)


class TestReassociate(TestCase):
    def test_add_of_two_reduced_values(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        self.assertExpectedInline(
            g.text(g.call(aten.add.Tensor, g.ar(a), g.ar(b))),
            """\
# reassociated: 1
add_tensor_1 = add.Tensor(a, b)
all_reduce_default_2 = all_reduce.default(add_tensor_1, 'sum', '7')
wait_tensor_default_2 = wait_tensor.default(all_reduce_default_2)
return wait_tensor_default_2""",
        )

    def test_chain_of_adds_and_subs_folds_into_one(self):
        # q, k, v input grads: (AR(q) + AR(k)) - AR(v) + AR(u) -> AR(((q + k) - v) + u)
        g = G()
        q, k, v, u = (g.x(n) for n in "qkvu")
        s = g.call(aten.add.Tensor, g.ar(q), g.ar(k))
        s = g.call(aten.sub.Tensor, s, g.ar(v))
        s = g.call(aten.add.Tensor, g.ar(u), s)
        self.assertExpectedInline(
            g.text(s),
            """\
# reassociated: 3
add_tensor_2 = add.Tensor(u, q)
add_tensor_3 = add.Tensor(add_tensor_2, k)
sub_tensor_1 = sub.Tensor(add_tensor_3, v)
all_reduce_default_4 = all_reduce.default(sub_tensor_1, 'sum', '7')
wait_tensor_default_4 = wait_tensor.default(all_reduce_default_4)
return wait_tensor_default_4""",
        )

    def test_avg(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        self.assertExpectedInline(
            g.text(g.call(aten.sub.Tensor, g.ar(a, "avg"), g.ar(b, "avg"))),
            """\
# reassociated: 1
sub_tensor_1 = sub.Tensor(a, b)
all_reduce_default_2 = all_reduce.default(sub_tensor_1, 'avg', '7')
wait_tensor_default_2 = wait_tensor.default(all_reduce_default_2)
return wait_tensor_default_2""",
        )

    # -- legality 1: add/sub without alpha, both operands reduced ----------------------------

    def test_alpha_is_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        self.assertExpectedInline(
            g.text(g.call(aten.add.Tensor, g.ar(a), g.ar(b), alpha=2)),
            """\
# reassociated: 0
all_reduce_default = all_reduce.default(a, 'sum', '7')
wait_tensor_default = wait_tensor.default(all_reduce_default)
all_reduce_default_1 = all_reduce.default(b, 'sum', '7')
wait_tensor_default_1 = wait_tensor.default(all_reduce_default_1)
add_tensor = add.Tensor(wait_tensor_default, wait_tensor_default_1, alpha=2)
return add_tensor""",
        )

    def test_one_operand_not_reduced_is_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        self.assertExpectedInline(
            g.text(g.call(aten.add.Tensor, g.ar(a), b)),
            """\
# reassociated: 0
all_reduce_default = all_reduce.default(a, 'sum', '7')
wait_tensor_default = wait_tensor.default(all_reduce_default)
add_tensor = add.Tensor(wait_tensor_default, b)
return add_tensor""",
        )

    def test_mul_is_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        self.assertExpectedInline(
            g.text(g.call(aten.mul.Tensor, g.ar(a), g.ar(b))),
            """\
# reassociated: 0
all_reduce_default = all_reduce.default(a, 'sum', '7')
wait_tensor_default = wait_tensor.default(all_reduce_default)
all_reduce_default_1 = all_reduce.default(b, 'sum', '7')
wait_tensor_default_1 = wait_tensor.default(all_reduce_default_1)
mul_tensor = mul.Tensor(wait_tensor_default, wait_tensor_default_1)
return mul_tensor""",
        )

    # -- legality 2: same group, same op, sum or floating avg -----------------------------

    def test_different_groups_are_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        out = g.text(g.call(aten.add.Tensor, g.ar(a, group="7"), g.ar(b, group="8")))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    def test_different_ops_are_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        out = g.text(g.call(aten.add.Tensor, g.ar(a, "sum"), g.ar(b, "avg")))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    def test_max_is_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        out = g.text(g.call(aten.add.Tensor, g.ar(a, "max"), g.ar(b, "max")))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    def test_integer_avg_is_kept_integer_sum_is_not(self):
        g = G()
        a, b = g.x("a", dtype=torch.int64), g.x("b", dtype=torch.int64)
        out = g.text(g.call(aten.add.Tensor, g.ar(a, "avg"), g.ar(b, "avg")))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")
        g = G()
        a, b = g.x("a", dtype=torch.int64), g.x("b", dtype=torch.int64)
        out = g.text(g.call(aten.add.Tensor, g.ar(a), g.ar(b)))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 1""")

    # -- legality 3: the reduced values have no other users -------------------------------

    def test_reduced_value_with_another_user_is_kept(self):
        g = G()
        a, b = g.x("a"), g.x("b")
        wa = g.ar(a)
        s = g.call(aten.add.Tensor, wa, g.ar(b))
        self.assertExpectedInline(
            g.text(s, wa),
            """\
# reassociated: 0
all_reduce_default = all_reduce.default(a, 'sum', '7')
wait_tensor_default = wait_tensor.default(all_reduce_default)
all_reduce_default_1 = all_reduce.default(b, 'sum', '7')
wait_tensor_default_1 = wait_tensor.default(all_reduce_default_1)
add_tensor = add.Tensor(wait_tensor_default, wait_tensor_default_1)
return [add_tensor, wait_tensor_default]""",
        )

    def test_same_reduced_value_twice_is_kept(self):
        g = G()
        wa = g.ar(g.x("a"))
        out = g.text(g.call(aten.add.Tensor, wa, wa))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    def test_middle_of_a_chain_with_another_user_stops_the_fold(self):
        # AR(a) + AR(b) folds; its sum is also returned, so the next add keeps it
        g = G()
        a, b, c = g.x("a"), g.x("b"), g.x("c")
        s = g.call(aten.add.Tensor, g.ar(a), g.ar(b))
        t = g.call(aten.add.Tensor, s, g.ar(c))
        self.assertExpectedInline(
            g.text(t, s),
            """\
# reassociated: 1
add_tensor_2 = add.Tensor(a, b)
all_reduce_default_3 = all_reduce.default(add_tensor_2, 'sum', '7')
wait_tensor_default_3 = wait_tensor.default(all_reduce_default_3)
all_reduce_default_2 = all_reduce.default(c, 'sum', '7')
wait_tensor_default_2 = wait_tensor.default(all_reduce_default_2)
add_tensor_1 = add.Tensor(wait_tensor_default_3, wait_tensor_default_2)
return [add_tensor_1, wait_tensor_default_3]""",
        )

    # -- legality 4: same dtype and shape (no broadcasting, no promotion) -----------------

    def test_broadcasting_add_is_kept(self):
        g = G()
        a, b = g.x("a", (4, 2)), g.x("b", (2,))
        out = g.text(g.call(aten.add.Tensor, g.ar(a), g.ar(b)))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    def test_type_promotion_is_kept(self):
        g = G()
        a, b = g.x("a", dtype=torch.float32), g.x("b", dtype=torch.float64)
        out = g.text(g.call(aten.add.Tensor, g.ar(a), g.ar(b)))
        self.assertExpectedInline(out.splitlines()[0], """# reassociated: 0""")

    # -- legality 5: the new add and all_reduce sit where the old add was -----------------

    def test_new_collective_follows_both_inputs(self):
        # b is computed between the two all_reduces: the new add comes after it
        g = G()
        a, x = g.x("a"), g.x("x")
        wa = g.ar(a)
        b = g.call(aten.mul.Tensor, x, 2.0)
        self.assertExpectedInline(
            g.text(g.call(aten.add.Tensor, wa, g.ar(b))),
            """\
# reassociated: 1
mul_tensor = mul.Tensor(x, 2.0)
add_tensor_1 = add.Tensor(a, mul_tensor)
all_reduce_default_2 = all_reduce.default(add_tensor_1, 'sum', '7')
wait_tensor_default_2 = wait_tensor.default(all_reduce_default_2)
return wait_tensor_default_2""",
        )

    # -- trees as autograd accumulates input grads -------------------------------------------

    def test_running_sum_with_other_terms(self):
        # g + AR(a) + AR(b) - AR(c): g stays, the three reduced terms fold into one
        g = G()
        r, a, b, c = g.x("g"), g.x("a"), g.x("b"), g.x("c")
        s = g.call(aten.add.Tensor, r, g.ar(a))
        s = g.call(aten.add.Tensor, s, g.ar(b))
        s = g.call(aten.sub.Tensor, s, g.ar(c))
        self.assertExpectedInline(
            g.text(s),
            """\
# reassociated: 2
add_tensor_2 = add.Tensor(a, b)
sub_tensor_1 = sub.Tensor(add_tensor_2, c)
all_reduce_default_3 = all_reduce.default(sub_tensor_1, 'sum', '7')
wait_tensor_default_3 = wait_tensor.default(all_reduce_default_3)
add_tensor_3 = add.Tensor(g, wait_tensor_default_3)
return add_tensor_3""",
        )

    def test_all_terms_negative(self):
        # g - AR(a) - AR(b) = g - AR(a + b)
        g = G()
        r, a, b = g.x("g"), g.x("a"), g.x("b")
        s = g.call(aten.sub.Tensor, r, g.ar(a))
        s = g.call(aten.sub.Tensor, s, g.ar(b))
        self.assertExpectedInline(
            g.text(s),
            """\
# reassociated: 1
add_tensor = add.Tensor(a, b)
all_reduce_default_2 = all_reduce.default(add_tensor, 'sum', '7')
wait_tensor_default_2 = wait_tensor.default(all_reduce_default_2)
sub_tensor_2 = sub.Tensor(g, wait_tensor_default_2)
return sub_tensor_2""",
        )

    def test_two_groups_fold_separately(self):
        g = G()
        a, b, c, d = g.x("a"), g.x("b"), g.x("c"), g.x("d")
        s = g.call(aten.add.Tensor, g.ar(a, group="1"), g.ar(b, group="2"))
        s = g.call(aten.add.Tensor, s, g.ar(c, group="1"))
        s = g.call(aten.add.Tensor, s, g.ar(d, group="2"))
        self.assertExpectedInline(
            g.text(s),
            """\
# reassociated: 2
add_tensor_3 = add.Tensor(a, c)
all_reduce_default_4 = all_reduce.default(add_tensor_3, 'sum', '1')
wait_tensor_default_4 = wait_tensor.default(all_reduce_default_4)
add_tensor_4 = add.Tensor(b, d)
all_reduce_default_5 = all_reduce.default(add_tensor_4, 'sum', '2')
wait_tensor_default_5 = wait_tensor.default(all_reduce_default_5)
add_tensor_5 = add.Tensor(wait_tensor_default_4, wait_tensor_default_5)
return add_tensor_5""",
        )

    def test_interior_sum_with_another_user_is_a_root(self):
        # (g + AR(a)) is also returned: it is a root of its own (one reduced term: kept);
        # the outer tree has it as a plain term and AR(b), AR(c) fold
        g = G()
        r, a, b, c = g.x("g"), g.x("a"), g.x("b"), g.x("c")
        s1 = g.call(aten.add.Tensor, r, g.ar(a))
        s = g.call(aten.add.Tensor, g.call(aten.add.Tensor, s1, g.ar(b)), g.ar(c))
        self.assertExpectedInline(
            g.text(s, s1),
            """\
# reassociated: 1
all_reduce_default = all_reduce.default(a, 'sum', '7')
wait_tensor_default = wait_tensor.default(all_reduce_default)
add_tensor = add.Tensor(g, wait_tensor_default)
add_tensor_3 = add.Tensor(b, c)
all_reduce_default_3 = all_reduce.default(add_tensor_3, 'sum', '7')
wait_tensor_default_3 = wait_tensor.default(all_reduce_default_3)
add_tensor_4 = add.Tensor(add_tensor, wait_tensor_default_3)
return [add_tensor_4, add_tensor]""",
        )
