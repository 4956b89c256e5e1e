"""Simulations that reproduce the paper's security and scale figures from the project's own
cores (docs/simulations.md): ``python -m simulations NAME --seed S [--quick]``."""
