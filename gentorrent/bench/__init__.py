"""Benchmarks of the overlay (``gentorrent bench wire|sida|overlay``) and the ``bench`` command.

No product module imports from here: benchmarks drive the product, never the
other way round. Each benchmark module exposes ``run(quick) -> (params, figures)``
and is registered in the ``gentorrent.benches`` entry-point group.
"""
