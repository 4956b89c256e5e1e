"""Benchmarks of model nodes (``gentorrent bench engine|hrtree|forwarding|forwarding-threshold``).

No product module imports from here. Baselines a benchmark compares against
(load-only or random forwarding, for instance) are built here and injected
into the node, not shipped as node flags.
"""
