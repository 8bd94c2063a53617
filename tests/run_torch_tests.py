"""Run a PyTorch distributed test file plain or with every process inside redist_opt.enabled().

PyTorch's DTensor tests spawn their ranks as new interpreters, so the routing is
entered at interpreter start by a ``sitecustomize.py`` this script writes to a
temporary directory and puts first on ``PYTHONPATH`` (the pytest runner and each
spawned rank import it). torch's test code is not part of this repository: pass
the path of your copy (e.g. pytorch's test/distributed/tensor/test_redistribute.py).

    python tests/run_torch_tests.py --mode routed /work/torchtests/test_redistribute.py::RedistributeTest -q

``--groups`` picks enabled()'s policy. Newer test files may import helpers torch
2.13 lacks: ``_assert_no_mixed_partial_types`` gets a no-op stand-in and
``MaskPartial`` is bound to 2.13's ``_MaskPartial``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

SITECUSTOMIZE = """
try:  # lets newer test files import on torch 2.13
    import torch.distributed.tensor._redistribute as _r
    if not hasattr(_r, "_assert_no_mixed_partial_types"):
        _r._assert_no_mixed_partial_types = lambda *a, **k: None
except Exception:
    pass
try:  # newer files import the public name of the vocab-parallel partial
    import torch.distributed.tensor.placement_types as _pt
    if not hasattr(_pt, "MaskPartial"):
        _pt.MaskPartial = _pt._MaskPartial
except Exception:
    pass
"""

ROUTED = """
import atexit as _atexit
import redist_opt as _redist_opt

_REDIST_OPT_ROUTE = _redist_opt.enabled(groups={groups!r})
_REDIST_OPT_ROUTE.__enter__()
_atexit.register(_REDIST_OPT_ROUTE.__exit__, None, None, None)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("plain", "routed"), required=True)
    parser.add_argument("--groups", default="existing", choices=("existing", "create"))
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="redist_opt_site_") as site:
        text = SITECUSTOMIZE + (ROUTED.format(groups=args.groups) if args.mode == "routed" else "")
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(text)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
        return subprocess.call(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], env=env
        )


if __name__ == "__main__":
    sys.exit(main())
