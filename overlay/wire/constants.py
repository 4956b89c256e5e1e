"""The numbers and names the directory shares with every layer, each defined once: peer entries,
the registration codec, the signed lists, the verifier's committee state and audits, and the
clients all import them from here (overlay imports no verifier, so the verifier takes them from
overlay; peer entries sit below the directory, so they live in the lowest layer)."""

from __future__ import annotations

# A node's role: in registration transactions and list records as the integer, in peer entries and
# list queries as the name.
ROLE_USER, ROLE_MODEL = 1, 2
ROLE_NAMES = {ROLE_USER: "user", ROLE_MODEL: "model"}

MIN_CAPACITY, MAX_CAPACITY = 1, 10  # a model node's capacity score (paper §3.1, §3.3)
MAX_CHAIN_ID = 50  # bytes: CometBFT's own limit on a chain id
MAX_VALIDATORS = 1000  # validators a committee (and so a signed list's certificate) may hold

# The committee's reputation, in fixed point: REPUTATION_SCALE means 1.0 (verifier/audit/reputation.py
# computes it; model records carry it). Users never send prompts to a model node under TRUST_LINE.
REPUTATION_SCALE = 1_000_000
TRUST_LINE = 400_000
