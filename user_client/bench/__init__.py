"""Benchmarks of the user role: ``gentorrent bench gateway``."""
