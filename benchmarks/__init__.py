"""Benchmarks: each module runs on its own (python benchmarks/NAME.py --help)."""
