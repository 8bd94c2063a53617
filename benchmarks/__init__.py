"""Benchmarks and harnesses run from a checkout (outside the shipped package)."""
