"""Benchmarks and harnesses of redist_opt, outside the shipped package: run them from a
checkout (``python -m benchmarks.decisions``); see benchmarks/README.md."""
