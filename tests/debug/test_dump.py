"""Golden dumps of the fixture cases (fixtures/cases.json), and the per-pass dump files.

Each fixture case has one ``test_golden_<id>`` below comparing the ``explain``
text (both plans, groups, rank lists, bytes, notes, IR; no modelled times, so a
recalibrated cost model does not churn them) with an inline expecttest golden.
A change in what a plan does shows up here in review. Regenerate after an
intended change with::

    EXPECTTEST_ACCEPT=1 python -m pytest tests/debug/test_dump.py

A new fixture case needs a ``test_golden_<id>`` method (``test_every_case_has_a_golden``
says which are missing); write it with an empty string and accept.
"""

from __future__ import annotations

import expecttest
import pytest
from support.explain_cases import case_plans, load_cases

import redist_opt
from redist_opt.debug import dump, explain
from redist_opt.debug.units import format_bytes, format_time


def render(case_id: str) -> str:
    case = load_cases()[case_id]
    naive, optimized = case_plans(case)
    return explain.format_explain(naive, optimized, groups=case["groups"]) + "\n"


class TestGoldens(expecttest.TestCase):
    def test_every_case_has_a_golden(self):
        methods = {m[len("test_golden_") :] for m in dir(self) if m.startswith("test_golden_")}
        cases = set(load_cases())
        self.assertEqual(sorted(cases - methods), [], "fixture cases without a golden test")
        self.assertEqual(sorted(methods - cases), [], "golden tests without a fixture case")

    def test_golden_design1_nonconsecutive_reductions(self):
        self.assertExpectedInline(
            render("design1_nonconsecutive_reductions"),
            """\
redistribute [P, P, P] -> [R, S(0), R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
flattened groups that exist: a+c; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective          group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum      a      2:4          128 B  [0,4] [1,5] +2 more
  2  reduce_scatter sum  b      2:2          128 B  [0,2] [1,3] +2 more
  3  all_reduce sum      c      2:1           64 B  [0,1] [2,3] +2 more
     total                                   320 B

optimized plan: 2 collectives; passes that changed it: reorder-collectives, merge-reductions
  #  collective          group  layout       bytes/rank  ranks (first groups)
  1  reduce_scatter sum  b      2:2               128 B  [0,2] [1,3] +2 more
  2  all_reduce sum      a+c    (2,2):(4,1)        64 B  [0,1,4,5] [2,3,6,7]
     total                                        192 B

naive/optimized: 1.50x collectives, 1.67x bytes per rank

notes (+ made, - not made):
  + [reorder-collectives] all_reduce(a), reduce_scatter(b), all_reduce(c) -> reduce_scatter(b), all_reduce(a), all_reduce(c): the moved steps commute (disjoint mesh and tensor dims, compatible reductions); after merging: 2 collectives, 192 B per rank (in order: 3, 320 B), less modelled time
  + [merge-reductions] all_reduce(a) + all_reduce(c) -> all_reduce(a+c): a process group with layout (2,2):(4,1) exists
  - [merge-reductions-into-all-reduce] reduce_scatter(b) + all_reduce(a+c) as one all_reduce: not made: no process group has layout 8:1 (groups=existing)

IR (naive):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
  %reduce_scatter = reduce_scatter(%all_reduce, {b 2:2}, 'sum', 0) : (4, 4)
  %all_reduce_1 = all_reduce(%reduce_scatter, {c 2:1}, 'sum') : (4, 4)
  return %all_reduce_1

IR (optimized):
  %x : (8, 4)
  %reduce_scatter = reduce_scatter(%x, {b 2:2}, 'sum', 0) : (4, 4)
  %all_reduce = all_reduce(%reduce_scatter, {a+c (2,2):(4,1)}, 'sum') : (4, 4)  # <- %all_reduce, %all_reduce_1
  return %all_reduce
""",
        )

    def test_golden_design2_partial_merge(self):
        self.assertExpectedInline(
            render("design2_partial_merge"),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
flattened groups that exist: a+b; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a      2:4          128 B  [0,4] [1,5] +2 more
  2  all_reduce sum  b      2:2          128 B  [0,2] [1,3] +2 more
  3  all_reduce sum  c      2:1          128 B  [0,1] [2,3] +2 more
     total                               384 B

optimized plan: 2 collectives; passes that changed it: merge-reductions
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a+b    4:2          128 B  [0,2,4,6] [1,3,5,7]
  2  all_reduce sum  c      2:1          128 B  [0,1] [2,3] +2 more
     total                               256 B

naive/optimized: 1.50x collectives, 1.50x bytes per rank

notes (+ made, - not made):
  - [merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c) as one: not made: no process group has layout 8:1 (groups=existing)
  + [merge-reductions] all_reduce(a) + all_reduce(b) -> all_reduce(a+b): a process group with layout 4:2 exists

IR (naive):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
  return %all_reduce_2

IR (optimized):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a+b 4:2}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1
  %all_reduce_1 = all_reduce(%all_reduce, {c 2:1}, 'sum') : (8, 4)
  return %all_reduce_1
""",
        )

    def test_golden_design3_uneven_all_gather(self):
        self.assertExpectedInline(
            render("design3_uneven_all_gather"),
            """\
redistribute [S(0), S(0)] -> [R, R] on mesh (a=2,b=2), shape (5, 3), float32
flattened groups that exist: a+b; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  b      2:1           24 B  [0,1] [2,3]
  2  all_gather  a      2:2           36 B  [0,2] [1,3]
     total                            60 B

optimized plan: 1 collective; passes that changed it: merge-all-gathers
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  a+b    4:1           24 B  [0,1,2,3]
     total                            24 B

naive/optimized: 2.00x collectives, 2.50x bytes per rank

notes (+ made, - not made):
  + [merge-all-gathers] all_gather(b) + all_gather(a) -> all_gather(a+b): a process group with layout 4:1 exists

IR (naive):
  %x : (chunk(chunk(5,2,c_a),2,c_b), 3)
  %pad_to = pad_to(%x, 0, ceildiv(chunk(5,2,c_a),2)) : (ceildiv(chunk(5,2,c_a),2), 3)
  %all_gather = all_gather(%pad_to, {b 2:1}, 0) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %narrow = narrow(%all_gather, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
  %pad_to_1 = pad_to(%narrow, 0, 3) : (3, 3)
  %all_gather_1 = all_gather(%pad_to_1, {a 2:2}, 0) : (6, 3)
  %narrow_1 = narrow(%all_gather_1, 0, 0, 5) : (5, 3)
  return %narrow_1

IR (optimized):
  %x : (chunk(chunk(5,2,c_a),2,c_b), 3)
  %pad_to = pad_to(%x, 0, 2) : (2, 3)  # <- %all_gather, %all_gather_1
  %all_gather = all_gather(%pad_to, {a+b 4:1}, 0) : (8, 3)  # <- %all_gather, %all_gather_1
  %unpad_nested = unpad_nested(%all_gather, 0, 5, (2, 2)) : (5, 3)  # <- %all_gather, %all_gather_1
  return %unpad_nested
""",
        )

    def test_golden_design4_uneven_reduce_scatter(self):
        self.assertExpectedInline(
            render("design4_uneven_reduce_scatter"),
            """\
redistribute [P, P] -> [S(0), S(0)] on mesh (a=2,b=2), shape (5, 3), float32
flattened groups that exist: a+b; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective          group  layout  bytes/rank  ranks (first groups)
  1  reduce_scatter sum  a      2:2           72 B  [0,2] [1,3]
  2  reduce_scatter sum  b      2:1           48 B  [0,1] [2,3]
     total                                   120 B

optimized plan: 1 collective; passes that changed it: merge-reduce-scatters
  #  collective          group  layout  bytes/rank  ranks (first groups)
  1  reduce_scatter sum  a+b    4:1           96 B  [0,1,2,3]
     total                                    96 B

naive/optimized: 2.00x collectives, 1.25x bytes per rank

notes (+ made, - not made):
  + [merge-reduce-scatters] reduce_scatter(a) + reduce_scatter(b) -> reduce_scatter(a+b): a process group with layout 4:1 exists

IR (naive):
  %x : (5, 3)
  %pad_nested = pad_nested(%x, 0, (2,)) : (6, 3)
  %reduce_scatter = reduce_scatter(%pad_nested, {a 2:2}, 'sum', 0) : (3, 3)
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(5,2,c_a)) : (chunk(5,2,c_a), 3)
  %pad_nested_1 = pad_nested(%narrow, 0, (2,)) : (2*ceildiv(chunk(5,2,c_a),2), 3)
  %reduce_scatter_1 = reduce_scatter(%pad_nested_1, {b 2:1}, 'sum', 0) : (ceildiv(2*ceildiv(chunk(5,2,c_a),2),2), 3)
  %narrow_1 = narrow(%reduce_scatter_1, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)
  return %narrow_1

IR (optimized):
  %x : (5, 3)
  %pad_nested = pad_nested(%x, 0, (2, 2)) : (8, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %reduce_scatter = reduce_scatter(%pad_nested, {a+b 4:1}, 'sum', 0) : (2, 3)  # <- %reduce_scatter, %reduce_scatter_1
  %narrow = narrow(%reduce_scatter, 0, 0, chunk(chunk(5,2,c_a),2,c_b)) : (chunk(chunk(5,2,c_a),2,c_b), 3)  # <- %reduce_scatter, %reduce_scatter_1
  return %narrow
""",
        )

    def test_golden_design4_all_to_all(self):
        self.assertExpectedInline(
            render("design4_all_to_all"),
            """\
redistribute [S(0), S(0)] -> [S(1), S(1)] on mesh (a=2,b=2), shape (8, 8), float32
flattened groups that exist: a+b; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  b      2:1           64 B  [0,1] [2,3]
  2  all_to_all  a      2:2          128 B  [0,2] [1,3]
     total                           192 B

optimized plan: 1 collective; passes that changed it: merge-all-to-alls
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_to_all  a+b    4:1           64 B  [0,1,2,3]
     total                            64 B

naive/optimized: 2.00x collectives, 3.00x bytes per rank

notes (+ made, - not made):
  + [merge-all-to-alls] all_gather(b) + all_to_all(a) + chunk(b) -> all_to_all(a+b): a process group with layout 4:1 exists

IR (naive):
  %x : (2, 8)
  %all_gather = all_gather(%x, {b 2:1}, 0) : (4, 8)
  %all_to_all = all_to_all(%all_gather, {a 2:2}, 1, 0) : (8, 4)
  %select_chunk = select_chunk(%all_to_all, 1, 2, c_b) : (8, 2)
  return %select_chunk

IR (optimized):
  %x : (2, 8)
  %all_to_all = all_to_all(%x, {a+b 4:1}, 1, 0) : (8, 2)  # <- %all_gather, %all_to_all
  return %all_to_all
""",
        )

    def test_golden_design5_create_group(self):
        self.assertExpectedInline(
            render("design5_create_group"),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
flattened groups that exist: none; groups=create

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a      2:4          128 B  [0,4] [1,5] +2 more
  2  all_reduce sum  b      2:2          128 B  [0,2] [1,3] +2 more
  3  all_reduce sum  c      2:1          128 B  [0,1] [2,3] +2 more
     total                               384 B

optimized plan: 1 collective; passes that changed it: merge-reductions
  #  collective      group    layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a+b+c *  8:1          128 B  [0,1,2,3,4,5,6,7]
     total                                 128 B
  * no process group with this layout exists yet: created on first use

naive/optimized: 3.00x collectives, 3.00x bytes per rank

notes (+ made, - not made):
  + [merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c) -> all_reduce(a+b+c): groups=create creates 8:1

IR (naive):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
  return %all_reduce_2

IR (optimized):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a+b+c 8:1}, 'sum') : (8, 4)  # <- %all_reduce, %all_reduce_1, %all_reduce_2
  return %all_reduce
""",
        )

    def test_golden_design5_reorder(self):
        self.assertExpectedInline(
            render("design5_reorder"),
            """\
redistribute [S(0), P, P] -> [R, R, S(0)] on mesh (a=2,b=2,c=2), shape (8, 4), float32
flattened groups that exist: a+c; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  c      2:1           64 B  [0,1] [2,3] +2 more
  2  all_reduce sum  b      2:2           64 B  [0,2] [1,3] +2 more
  3  all_gather      a      2:4           64 B  [0,4] [1,5] +2 more
     total                               192 B

optimized plan: 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  c      2:1           64 B  [0,1] [2,3] +2 more
  2  all_reduce sum  b      2:2           64 B  [0,2] [1,3] +2 more
  3  all_gather      a      2:4           64 B  [0,4] [1,5] +2 more
     total                               192 B

naive/optimized: 1.00x collectives, 1.00x bytes per rank

notes (+ made, - not made):
  - [merge-reductions] all_reduce(c) + all_reduce(b): not made: no process group has layout 4:1 (groups=existing)

IR (naive):
  %x : (4, 4)
  %all_reduce = all_reduce(%x, {c 2:1}, 'sum') : (4, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (4, 4)
  %all_gather = all_gather(%all_reduce_1, {a 2:4}, 0) : (8, 4)
  %select_chunk = select_chunk(%all_gather, 0, 2, c_c) : (4, 4)
  return %select_chunk

IR (optimized):
  %x : (4, 4)
  %all_reduce = all_reduce(%x, {c 2:1}, 'sum') : (4, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (4, 4)
  %all_gather = all_gather(%all_reduce_1, {a 2:4}, 0) : (8, 4)
  %select_chunk = select_chunk(%all_gather, 0, 2, c_c) : (4, 4)
  return %select_chunk
""",
        )

    def test_golden_no_group_available(self):
        self.assertExpectedInline(
            render("no_group_available"),
            """\
redistribute [P, P, P] -> [R, R, R] on mesh (a=2,b=2,c=2), shape (8, 4), float32
flattened groups that exist: none; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a      2:4          128 B  [0,4] [1,5] +2 more
  2  all_reduce sum  b      2:2          128 B  [0,2] [1,3] +2 more
  3  all_reduce sum  c      2:1          128 B  [0,1] [2,3] +2 more
     total                               384 B

optimized plan: 3 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  a      2:4          128 B  [0,4] [1,5] +2 more
  2  all_reduce sum  b      2:2          128 B  [0,2] [1,3] +2 more
  3  all_reduce sum  c      2:1          128 B  [0,1] [2,3] +2 more
     total                               384 B

naive/optimized: 1.00x collectives, 1.00x bytes per rank

notes (+ made, - not made):
  - [merge-reductions] all_reduce(a) + all_reduce(b) + all_reduce(c): not made: no process group has layout 8:1 (groups=existing)

IR (naive):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
  return %all_reduce_2

IR (optimized):
  %x : (8, 4)
  %all_reduce = all_reduce(%x, {a 2:4}, 'sum') : (8, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:2}, 'sum') : (8, 4)
  %all_reduce_2 = all_reduce(%all_reduce_1, {c 2:1}, 'sum') : (8, 4)
  return %all_reduce_2
""",
        )

    def test_golden_reduce_op_max(self):
        self.assertExpectedInline(
            render("reduce_op_max"),
            """\
redistribute [P(max), P(max)] -> [R, R] on mesh (a=2,b=2), shape (4, 4), float32
flattened groups that exist: a+b; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce max  a      2:2           64 B  [0,2] [1,3]
  2  all_reduce max  b      2:1           64 B  [0,1] [2,3]
     total                               128 B

optimized plan: 1 collective; passes that changed it: merge-reductions
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce max  a+b    4:1           64 B  [0,1,2,3]
     total                                64 B

naive/optimized: 2.00x collectives, 2.00x bytes per rank

notes (+ made, - not made):
  + [merge-reductions] all_reduce(a) + all_reduce(b) -> all_reduce(a+b): a process group with layout 4:1 exists

IR (naive):
  %x : (4, 4)
  %all_reduce = all_reduce(%x, {a 2:2}, 'max') : (4, 4)
  %all_reduce_1 = all_reduce(%all_reduce, {b 2:1}, 'max') : (4, 4)
  return %all_reduce_1

IR (optimized):
  %x : (4, 4)
  %all_reduce = all_reduce(%x, {a+b 4:1}, 'max') : (4, 4)  # <- %all_reduce, %all_reduce_1
  return %all_reduce
""",
        )

    def test_golden_avg_bf16(self):
        self.assertExpectedInline(
            render("avg_bf16"),
            """\
redistribute [P(avg), P(avg)] -> [R, S(1)] on mesh (dp=2,tp=4), shape (6, 8), bfloat16
flattened groups that exist: dp+tp; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective          group  layout  bytes/rank  ranks (first groups)
  1  all_reduce avg      dp     2:4           96 B  [0,4] [1,5] +2 more
  2  reduce_scatter avg  tp     4:1           96 B  [0,1,2,3] [4,5,6,7]
     total                                   192 B

optimized plan: 1 collective; passes that changed it: reorder-collectives, merge-reductions-into-all-reduce
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce avg  dp+tp  8:1           96 B  [0,1,2,3,4,5,6,7]
     total                                96 B

naive/optimized: 2.00x collectives, 2.00x bytes per rank

notes (+ made, - not made):
  + [reorder-collectives] all_reduce(dp), reduce_scatter(tp) -> reduce_scatter(tp), all_reduce(dp): the moved steps commute (disjoint mesh and tensor dims, compatible reductions); after merging: 2 collectives, 120 B per rank (in order: 2, 192 B), less modelled time
  + [merge-reductions-into-all-reduce] reduce_scatter(tp) + all_reduce(dp) -> all_reduce(dp+tp), chunk(tp): one all_reduce 22.0us vs 28.0us under the nccl cost model (more bytes, fewer launches); existing group

IR (naive):
  %x : (6, 8)
  %all_reduce = all_reduce(%x, {dp 2:4}, 'avg') : (6, 8)
  %reduce_scatter = reduce_scatter(%all_reduce, {tp 4:1}, 'avg', 1) : (6, 2)
  return %reduce_scatter

IR (optimized):
  %x : (6, 8)
  %all_reduce = all_reduce(%x, {dp+tp 8:1}, 'avg') : (6, 8)  # <- %reduce_scatter, %all_reduce
  %select_chunk = select_chunk(%all_reduce, 1, 4, c_tp) : (6, 2)  # <- %reduce_scatter, %all_reduce
  return %select_chunk
""",
        )

    def test_golden_uneven_3d_demo(self):
        self.assertExpectedInline(
            render("uneven_3d_demo"),
            """\
redistribute [S(0), S(0), S(1)] -> [R, R, R] on mesh (dp=2,cp=2,tp=2), shape (5, 3), float32
flattened groups that exist: dp+cp; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 3 collectives
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  tp     2:1           16 B  [0,1] [2,3] +2 more
  2  all_gather  cp     2:2           24 B  [0,2] [1,3] +2 more
  3  all_gather  dp     2:4           36 B  [0,4] [1,5] +2 more
     total                            76 B

optimized plan: 2 collectives; passes that changed it: merge-all-gathers
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  tp     2:1           16 B  [0,1] [2,3] +2 more
  2  all_gather  dp+cp  4:2           24 B  [0,2,4,6] [1,3,5,7]
     total                            40 B

naive/optimized: 1.50x collectives, 1.90x bytes per rank

notes (+ made, - not made):
  + [merge-all-gathers] all_gather(cp) + all_gather(dp) -> all_gather(dp+cp): a process group with layout 4:2 exists
  - [merge-gathers-across-dims] all_gather(tp) + all_gather(dp+cp): not made: no process group has layout 8:1 (groups=existing)

IR (naive):
  %x : (chunk(chunk(5,2,c_dp),2,c_cp), chunk(3,2,c_tp))
  %pad_to = pad_to(%x, 1, 2) : (chunk(chunk(5,2,c_dp),2,c_cp), 2)
  %all_gather = all_gather(%pad_to, {tp 2:1}, 1) : (chunk(chunk(5,2,c_dp),2,c_cp), 4)
  %narrow = narrow(%all_gather, 1, 0, 3) : (chunk(chunk(5,2,c_dp),2,c_cp), 3)
  %pad_to_1 = pad_to(%narrow, 0, ceildiv(chunk(5,2,c_dp),2)) : (ceildiv(chunk(5,2,c_dp),2), 3)
  %all_gather_1 = all_gather(%pad_to_1, {cp 2:2}, 0) : (2*ceildiv(chunk(5,2,c_dp),2), 3)
  %narrow_1 = narrow(%all_gather_1, 0, 0, chunk(5,2,c_dp)) : (chunk(5,2,c_dp), 3)
  %pad_to_2 = pad_to(%narrow_1, 0, 3) : (3, 3)
  %all_gather_2 = all_gather(%pad_to_2, {dp 2:4}, 0) : (6, 3)
  %narrow_2 = narrow(%all_gather_2, 0, 0, 5) : (5, 3)
  return %narrow_2

IR (optimized):
  %x : (chunk(chunk(5,2,c_dp),2,c_cp), chunk(3,2,c_tp))
  %pad_to = pad_to(%x, 1, 2) : (chunk(chunk(5,2,c_dp),2,c_cp), 2)
  %all_gather = all_gather(%pad_to, {tp 2:1}, 1) : (chunk(chunk(5,2,c_dp),2,c_cp), 4)
  %narrow = narrow(%all_gather, 1, 0, 3) : (chunk(chunk(5,2,c_dp),2,c_cp), 3)
  %pad_to_1 = pad_to(%narrow, 0, 2) : (2, 3)  # <- %all_gather_1, %all_gather_2
  %all_gather_1 = all_gather(%pad_to_1, {dp+cp 4:2}, 0) : (8, 3)  # <- %all_gather_1, %all_gather_2
  %unpad_nested = unpad_nested(%all_gather_1, 0, 5, (2, 2)) : (5, 3)  # <- %all_gather_1, %all_gather_2
  return %unpad_nested
""",
        )

    def test_golden_one_dim_mesh(self):
        self.assertExpectedInline(
            render("one_dim_mesh"),
            """\
redistribute [S(0)] -> [R] on mesh (x=4), shape (6, 2), float32
flattened groups that exist: none; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 1 collective
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  x      4:1           16 B  [0,1,2,3]
     total                            16 B

optimized plan: 1 collective
  #  collective  group  layout  bytes/rank  ranks (first groups)
  1  all_gather  x      4:1           16 B  [0,1,2,3]
     total                            16 B

naive/optimized: 1.00x collectives, 1.00x bytes per rank

notes: none (no pass recorded a decision)

IR (naive):
  %x : (chunk(6,4,c_x), 2)
  %pad_to = pad_to(%x, 0, 2) : (2, 2)
  %all_gather = all_gather(%pad_to, {x 4:1}, 0) : (8, 2)
  %narrow = narrow(%all_gather, 0, 0, 6) : (6, 2)
  return %narrow

IR (optimized):
  %x : (chunk(6,4,c_x), 2)
  %pad_to = pad_to(%x, 0, 2) : (2, 2)
  %all_gather = all_gather(%pad_to, {x 4:1}, 0) : (8, 2)
  %narrow = narrow(%all_gather, 0, 0, 6) : (6, 2)
  return %narrow
""",
        )

    def test_golden_no_op(self):
        self.assertExpectedInline(
            render("no_op"),
            """\
redistribute [S(0), R] -> [S(0), R] on mesh (a=2,b=2), shape (4, 4), float32
flattened groups that exist: none; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 0 collectives

optimized plan: 0 collectives

naive/optimized: n/a collectives, n/a bytes per rank

notes: none (no pass recorded a decision)

IR (naive):
  %x : (2, 4)
  return %x

IR (optimized):
  %x : (2, 4)
  return %x
""",
        )

    def test_golden_four_dim_mesh(self):
        self.assertExpectedInline(
            render("four_dim_mesh"),
            """\
redistribute [R, P, P, S(1)] -> [R, R, S(0), S(1)] on mesh (pp=2,dp=2,cp=2,tp=2), shape (16, 8), float32
flattened groups that exist: dp+cp; groups=existing

naive plan (DTensor's greedy planner, merge pass disabled): 2 collectives
  #  collective          group  layout  bytes/rank  ranks (first groups)
  1  reduce_scatter sum  cp     2:2          256 B  [0,2] [1,3] +6 more
  2  all_reduce sum      dp     2:4          128 B  [0,4] [1,5] +6 more
     total                                   384 B

optimized plan: 1 collective; passes that changed it: merge-reductions-into-all-reduce
  #  collective      group  layout  bytes/rank  ranks (first groups)
  1  all_reduce sum  dp+cp  4:2          256 B  [0,2,4,6] [1,3,5,7] +2 more
     total                               256 B

naive/optimized: 2.00x collectives, 1.50x bytes per rank

notes (+ made, - not made):
  + [merge-reductions-into-all-reduce] reduce_scatter(cp) + all_reduce(dp) -> all_reduce(dp+cp), chunk(cp): one all_reduce 18.0us vs 26.0us under the nccl cost model (more bytes, fewer launches); existing group

IR (naive):
  %x : (16, 4)
  %reduce_scatter = reduce_scatter(%x, {cp 2:2}, 'sum', 0) : (8, 4)
  %all_reduce = all_reduce(%reduce_scatter, {dp 2:4}, 'sum') : (8, 4)
  return %all_reduce

IR (optimized):
  %x : (16, 4)
  %all_reduce = all_reduce(%x, {dp+cp 4:2}, 'sum') : (16, 4)  # <- %reduce_scatter, %all_reduce
  %select_chunk = select_chunk(%all_reduce, 0, 2, c_cp) : (8, 4)  # <- %reduce_scatter, %all_reduce
  return %select_chunk
""",
        )


# -- format helpers ------------------------------------------------------------------


def test_format_bytes_and_time():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(16 * 2**20) == "16.0 MiB"
    assert format_time(None) == "-"
    assert format_time(12.34e-6) == "12.3 us"
    assert format_time(2.5e-3) == "2.50 ms"
    assert format_bytes(None) == "-"
    # the quality report's digits, and the exact spelling a size list reads back
    assert format_bytes(16 * 2**20, digits=".4g") == "16 MiB"
    assert format_bytes(1234567, digits=".4g") == "1.177 MiB"
    assert format_bytes(65536, sep="", exact=True) == "64KiB"
    assert format_bytes(1536, sep="", exact=True) == "1536B"


def test_str_plan_is_format_plan():
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    assert str(optimized) == dump.format_plan(optimized)
    text = dump.format_plan(optimized)
    for c in optimized.collectives():
        assert f"%{c.node} = {c.kind}(" in text
    for note in optimized.notes:
        assert note.what in text


def test_long_rank_lists_are_elided_in_text():
    spec = redist_opt.MeshSpec(sizes=(4, 64), names=("dp", "tp"))
    p = redist_opt.plan(spec, "R,P", "R,R", shape=(64,))
    text = explain.format_explain(p, p, rank_limit=1)
    assert "[0,1,2,3,4,5,...,63] +3 more" in text
    data = explain.explain_data(p, p, rank_limit=1)
    assert data["plans"]["naive"]["collectives"][0]["group"]["rank_lists"] == [list(range(64))]


def test_plan_tag():
    naive, _ = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    assert dump.plan_tag(naive) == "a2-b2-c2_P-P-P_to_R-S0-R_8x4_float32"


# -- per-pass dump files -------------------------------------------------------------


def test_write_pass_dump_names_and_contents(tmp_path, monkeypatch):
    monkeypatch.delenv(dump.DUMP_PASSES_ENV, raising=False)
    monkeypatch.setattr(dump, "rank_suffix", lambda: "")  # names as in a one-rank run (see test_dump_ranks)
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    before = dump.write_pass_dump(tmp_path / "d", 0, "default", None, naive)
    after = dump.write_pass_dump(tmp_path / "d", 1, "default", "merge-reductions", optimized)
    assert [p.name for p in before] == [
        "0000.default.before_pipeline.txt",
        "0000.default.before_pipeline.dot",
    ]
    assert [p.name for p in after] == [
        "0001.default.after_merge-reductions.txt",
        "0001.default.after_merge-reductions.dot",
    ]
    assert before[0].read_text() == dump.format_plan(naive) + "\n"
    assert after[0].read_text() == dump.format_plan(optimized) + "\n"
    dot = after[1].read_text()
    assert dot.startswith('digraph "0001.default.after_merge-reductions" {') and dot.rstrip().endswith("}")
    # "before_pipeline" and "after_<name>" spell the stage explicitly too
    same = dump.write_pass_dump(tmp_path / "e", 1, "default", "after_merge-reductions", optimized)
    assert same[0].name == after[0].name
    assert (
        dump.write_pass_dump(tmp_path / "e", 0, "default", "before_pipeline", naive)[0].name == before[0].name
    )


def test_write_pass_dump_filter(tmp_path, monkeypatch):
    monkeypatch.setattr(dump, "rank_suffix", lambda: "")  # names as in a one-rank run (see test_dump_ranks)
    naive, optimized = case_plans(load_cases()["design1_nonconsecutive_reductions"])
    monkeypatch.setenv(dump.DUMP_PASSES_ENV, "^merge-")
    assert dump.write_pass_dump(tmp_path, 1, "default", "reorder-collectives", optimized) == []
    assert len(dump.write_pass_dump(tmp_path, 2, "default", "merge-reductions", optimized)) == 2
    # the IR before the pipeline is always written: it is what the diffs start from
    assert len(dump.write_pass_dump(tmp_path, 0, "default", None, naive)) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt") == [
        "0000.default.before_pipeline.txt",
        "0002.default.after_merge-reductions.txt",
    ]
    monkeypatch.setenv(dump.DUMP_PASSES_ENV, "merge-(")
    with pytest.raises(ValueError, match=dump.DUMP_PASSES_ENV):
        dump.write_pass_dump(tmp_path, 3, "default", "merge-reductions", optimized)


def test_dump_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv(dump.DUMP_DIR_ENV, raising=False)
    assert dump.dump_dir_from_env() is None
    monkeypatch.setenv(dump.DUMP_DIR_ENV, "")
    assert dump.dump_dir_from_env() is None
    monkeypatch.setenv(dump.DUMP_DIR_ENV, str(tmp_path))
    assert dump.dump_dir_from_env() == tmp_path
