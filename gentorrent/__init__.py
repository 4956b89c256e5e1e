"""The application: the ``gentorrent`` command line (:mod:`gentorrent.cli`) and node configuration
(:mod:`gentorrent.config`), which every role's command uses, and the whole-network tools
(:mod:`gentorrent.tools`: devnet, localnet, status, testbed) and benchmarks
(:mod:`gentorrent.bench`), which use every role. Roles import only ``gentorrent.cli`` and
``gentorrent.config`` from here (tests/unit/test_layering.py)."""
