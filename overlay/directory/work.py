"""Registration work: the memory-hard proof of work a new key pays to register (decision 0014).

A registration transaction carries a ``nonce``; its *work* is the number of leading zero bits of::

    scrypt(password = WORK_CONTEXT || len(chain_id) (u8) || chain_id || ed25519_public || nonce,
           salt = WORK_SALT, n = 2**n_log2, r = 8, p = 1, dklen = 32)

The committee requires at least :func:`verifier.admission.required_bits` bits, which rise with the
registration rate. The proof binds the key and the chain, not the address or the transaction: a
node that must send its register again (a refusal, a restart) reuses its nonce. Each trial costs
one scrypt of ``128 * r * 2**n_log2`` bytes (16 MiB at the default ``n_log2 = 14``), so trials do
not parallelise cheaply on a GPU; checking a proof costs one trial.

Pure functions, no I/O, no clock: :func:`solve` is CPU-bound (callers run it in a thread).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

WORK_CONTEXT = b"gentorrent/registration-work/v1\x00"
WORK_SALT = b"gentorrent/registration-work/salt/v1"
NONCE_LEN = 16
SCRYPT_R = 8
MIN_N_LOG2, MAX_N_LOG2 = 1, 20
MAX_BITS = 64


def _password(chain_id: str, ed25519_public: bytes, nonce: bytes) -> bytes:
    chain = chain_id.encode()
    return WORK_CONTEXT + bytes([len(chain)]) + chain + ed25519_public + nonce


def digest(chain_id: str, ed25519_public: bytes, nonce: bytes, n_log2: int) -> bytes:
    """The 32-byte scrypt output a nonce is judged by."""
    if not MIN_N_LOG2 <= n_log2 <= MAX_N_LOG2:
        raise ValueError(f"scrypt n_log2 {n_log2} outside {MIN_N_LOG2}..{MAX_N_LOG2}")
    n = 1 << n_log2
    return hashlib.scrypt(_password(chain_id, ed25519_public, nonce), salt=WORK_SALT, n=n, r=SCRYPT_R, p=1,
                          maxmem=256 * SCRYPT_R * n + (1 << 20), dklen=32)


def leading_zero_bits(data: bytes) -> int:
    value = int.from_bytes(data, "big")
    return len(data) * 8 - value.bit_length()


def bits_of(chain_id: str, ed25519_public: bytes, nonce: bytes, n_log2: int) -> int:
    """The work ``nonce`` proves for this key on this chain (leading zero bits of its digest)."""
    return leading_zero_bits(digest(chain_id, ed25519_public, nonce, n_log2))


def solve(chain_id: str, ed25519_public: bytes, bits: int, n_log2: int, *,
          cancelled: Callable[[], bool] = lambda: False, max_trials: int | None = None) -> tuple[bytes, int] | None:
    """A nonce proving at least ``bits`` (``(nonce, trials)``), or None when ``cancelled()`` turns
    true or ``max_trials`` run out. ``bits == 0`` needs no trial (the empty nonce). Expected trials:
    ``2**bits``."""
    if not 0 <= bits <= MAX_BITS:
        raise ValueError(f"work bits {bits} outside 0..{MAX_BITS}")
    if bits == 0:
        return b"", 0
    base = os.urandom(NONCE_LEN - 8)
    trials = 0
    while max_trials is None or trials < max_trials:
        if cancelled():
            return None
        nonce = base + trials.to_bytes(8, "big")
        trials += 1
        if bits_of(chain_id, ed25519_public, nonce, n_log2) >= bits:
            return nonce, trials
    return None
