"""``python -m redist_opt ...``: the same command as ``redist-opt ...``."""

from redist_opt.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
