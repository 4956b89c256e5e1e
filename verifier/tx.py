"""Committee transactions: the codec lives in :mod:`overlay.registration` (nodes sign with it, the
verifiers decode with it: one codec). This module re-exports it under the verifier's name."""

from overlay.registration import (
    DECODE_ERRORS,
    MAX_ADDRESS,
    MAX_CAPACITY,
    MAX_CHAIN_ID,
    MAX_MODEL_ID,
    MAX_REGION,
    MAX_SEQ,
    MAX_TX_BYTES,
    MIN_CAPACITY,
    OP_LEAVE,
    OP_NAMES,
    OP_REGISTER,
    OP_UPDATE,
    ROLE_MODEL,
    ROLE_NAMES,
    ROLE_USER,
    TX_CONTEXT,
    TX_VERSION,
    Code,
    Entry,
    Tx,
    TxError,
    check_address,
    check_entry,
    decode_tx,
    make_tx,
    pack,
    signing_bytes,
)

__all__ = [
    "DECODE_ERRORS", "MAX_ADDRESS", "MAX_CAPACITY", "MAX_CHAIN_ID", "MAX_MODEL_ID", "MAX_REGION", "MAX_SEQ",
    "MAX_TX_BYTES", "MIN_CAPACITY", "OP_LEAVE", "OP_NAMES", "OP_REGISTER", "OP_UPDATE", "ROLE_MODEL",
    "ROLE_NAMES", "ROLE_USER", "TX_CONTEXT", "TX_VERSION", "Code", "Entry", "Tx", "TxError", "check_address",
    "check_entry", "decode_tx", "make_tx", "pack", "signing_bytes",
]
