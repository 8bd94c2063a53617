"""Dump files of the compiled graphs, written where ``REDIST_OPT_DUMP_DIR`` names
(:func:`~redist_opt.debug.dump.dump_dir_from_env`).

Two writers, one per producer of graphs:

* the compiled-graph pass, per graph (:class:`GraphPassDump`):
  ``NNNN.graph_pass[.rankR].before.txt`` (the graph as given),
  ``NNNN.graph_pass[.rankR].chainCC.txt`` per raised chain (its result line, then its
  naive and optimized plans), ``NNNN.graph_pass[.rankR].after.txt`` (the graph as
  rewritten) and ``NNNN.graph_pass[.rankR].explain.txt`` (the pass's ``explain()``);
* ``redist_opt.backend``, per forward / backward graph it produced
  (:func:`write_compile_dump`): ``NNNN.compile[.rankR].{forward,backward}.txt``, the
  collectives with their group names and the mesh dims each group stands for, then the graph.

Each writer numbers its files with its own counter, for the whole process. What goes in
a file (a result's text, a plan's text, the collectives' lines) is the caller's; this
module only names and writes the files.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import torch.fx as fx

from redist_opt.debug.dump import dump_dir_from_env, rank_suffix

__all__ = ["GraphPassDump", "write_compile_dump"]

_graph_pass_seq = itertools.count()
_compile_seq = itertools.count()
_compile_lock = threading.Lock()


def _write(directory: Path, name: str, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)


def _graph_text(gm) -> str:
    if isinstance(gm, fx.GraphModule):
        return gm.print_readable(print_output=False) if hasattr(gm, "print_readable") else gm.code
    return str(gm)


class GraphPassDump:
    """The dump files of the compiled-graph pass over one graph, all under one tag
    ``NNNN.graph_pass[.rankR]``. :meth:`from_env` gives None when no directory is set."""

    def __init__(self, directory) -> None:
        self.directory = Path(directory)
        self.tag = f"{next(_graph_pass_seq):04d}.graph_pass{rank_suffix()}"

    @classmethod
    def from_env(cls) -> GraphPassDump | None:
        directory = dump_dir_from_env()
        return cls(directory) if directory is not None else None

    def graph(self, stage: str, gm) -> None:
        """``<tag>.<stage>.txt``: ``gm`` (a GraphModule's readable code, or a Graph) at ``stage``."""
        _write(self.directory, f"{self.tag}.{stage}.txt", _graph_text(gm))

    def chain(self, index: int, nodes, result, plans) -> None:
        """``<tag>.chainCC.txt``: the chain's ``nodes`` (names), its ``result`` line, then
        ``plans``: (naive, optimized), or none where it was not planned."""
        lines = [f"chain: {' -> '.join(nodes)}", str(result), ""]
        for title, p in zip(("raised (naive plan)", "optimized"), plans):
            lines += [f"== {title} ==", str(p), ""]
        _write(self.directory, f"{self.tag}.chain{index:02d}.txt", "\n".join(lines))

    def explain(self, text: str) -> None:
        """``<tag>.explain.txt``: the pass's account of the graph."""
        _write(self.directory, f"{self.tag}.explain.txt", text + "\n")


def write_compile_dump(kind: str, collective_lines: list[str], graph) -> None:
    """``NNNN.compile[.rankR].<kind>.txt`` for a ``kind`` ("forward" / "backward") graph
    ``redist_opt.backend`` traced: ``collective_lines`` (one per collective), then ``graph``.
    Nothing when no dump directory is set."""
    directory = dump_dir_from_env()
    if directory is None:
        return
    with _compile_lock:
        seq = next(_compile_seq)
    text = [f"# {kind} graph traced by redist_opt.backend", f"# {len(collective_lines)} collective(s)"]
    text += [f"#   {line}" for line in collective_lines] or ["#   (none)"]
    text += ["", str(graph)]
    _write(directory, f"{seq:04d}.compile{rank_suffix()}.{kind}.txt", "\n".join(text) + "\n")
