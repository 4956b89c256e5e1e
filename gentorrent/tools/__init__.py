"""Tools that run or inspect nodes from outside: ``devnet``, ``status``, local process networks.

A running node imports nothing from here; these modules start node processes,
dial them and print what they see.
"""
