"""Benchmarks (not tests): each one is a module run as ``python -m bench.<name>``."""
