"""Small fx graphs built by hand, as a compiled graph has them: funcol collectives
followed by ``wait_tensor`` nodes, every node's ``meta["val"]`` a fake tensor, group
names plain strings. A graph pass test builds one, runs its pass on it, and compares
the graph's text::

    g = GraphBuilder("combined", lambda graph: combine_collectives(graph, stub_time))
    a, b = g.x("a"), g.x("b", (2, 3))
    self.assertExpectedInline(g.text(g.ag(a), g.ag(b)), '''...''')
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["GraphBuilder", "C10D", "graph_text"]

C10D = torch.ops._c10d_functional


class GraphBuilder:
    """``x(name, shape)`` placeholders, ``call(target, *args)`` nodes (their value is
    ``target`` applied to the fake values of its inputs), ``ag``/``ar``/``wait`` collectives;
    ``text(*outs)`` returns the graph's output, runs ``rewrite(graph)`` (a pass returning
    one record with ``removed`` per rewrite) and gives the rewritten graph's text, headed
    by ``# <label>: <collectives removed>``."""

    def __init__(self, label: str, rewrite) -> None:
        self.label, self.rewrite = label, rewrite
        self.graph = fx.Graph()
        self.mode = FakeTensorMode()

    def x(self, name, shape=(4, 2), dtype=torch.float32):
        n = self.graph.placeholder(name)
        with self.mode:
            n.meta["val"] = torch.empty(shape, dtype=dtype)
        return n

    def call(self, target, *args, **kwargs):
        n = self.graph.call_function(target, args, kwargs)
        with self.mode:
            n.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args], **kwargs)
        return n

    def ag(self, x, group="7", n=2):
        return self.wait(self.call(C10D.all_gather_into_tensor.default, x, n, group))

    def ar(self, x, op="sum", group="7"):
        return self.wait(self.call(C10D.all_reduce.default, x, op, group))

    def wait(self, c):
        return self.call(C10D.wait_tensor.default, c)

    def text(self, *outs) -> str:
        self.graph.output(outs[0] if len(outs) == 1 else tuple(outs))
        self.graph.lint()
        done = self.rewrite(self.graph)
        self.graph.lint()
        return f"# {self.label}: {sum(r.removed for r in done)}\n" + graph_text(self.graph)


def graph_text(graph: fx.Graph) -> str:
    """One line per call (``name = target(args, key=value)``) and the return."""
    lines = []
    for n in graph.nodes:
        if n.op == "call_function":
            name = (
                getattr(n.target, "__name__", None)
                if callable(n.target) and not isinstance(n.target, torch._ops.OpOverload)
                else None
            )
            name = name or str(n.target).replace("_c10d_functional.", "").replace("aten.", "")
            args = ", ".join(_arg(a) for a in n.args)
            kw = "".join(f", {k}={v!r}" for k, v in n.kwargs.items())
            lines.append(f"{n.name} = {name}({args}{kw})")
        elif n.op == "output":
            lines.append(f"return {_arg(n.args[0])}")
    return "\n".join(lines)


def _arg(a):
    if isinstance(a, fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_arg(x) for x in a) + "]"
    return repr(a)
