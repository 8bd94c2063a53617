"""One Inductor compile with the graph pass as its post-grad pass, against the FX graph
cache in ``$TORCHINDUCTOR_CACHE_DIR``; prints whether it was a cache hit or a miss and
which redist_opt it imported (a test may put a copied tree first on ``PYTHONPATH``).

Usage as a script: ``python cache_key_programs.py`` (prints JSON).
"""

from __future__ import annotations

import os
import sys

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.append(TESTS)  # after a copied tree on PYTHONPATH, which must win

import redist_opt  # noqa: E402
from redist_opt.graph_pass import RedistGraphPass  # noqa: E402
from support.program_report import emit  # noqa: E402


def compile_once() -> dict:
    """Compile a small function (no collectives: the key, not the rewrite, is tested)."""
    torch._dynamo.reset()
    counters.clear()
    # AOTAutograd's cache off: the FX graph cache alone decides, and counts.
    with (
        inductor_config.patch(fx_graph_cache=True, post_grad_custom_post_pass=RedistGraphPass()),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        out = torch.compile(lambda t: (t * 2).sin() + 1)(torch.arange(6.0))
    assert torch.allclose(out, (torch.arange(6.0) * 2).sin() + 1)
    return {
        "hit": counters["inductor"]["fxgraph_cache_hit"],
        "miss": counters["inductor"]["fxgraph_cache_miss"],
        "bypass": counters["inductor"]["fxgraph_cache_bypass"],
        "package": os.path.dirname(os.path.abspath(redist_opt.__file__)),
    }


if __name__ == "__main__":
    emit(compile_once())
