"""Benchmarks shipped with the package (``lattica bench ...``): they print figures, assert nothing."""
