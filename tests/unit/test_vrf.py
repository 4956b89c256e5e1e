"""ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381) and the epoch leader election (verifier/vrf.py)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl import bindings as sodium

from verifier import vrf

# RFC 9381 appendix B.3, examples 16-18: (SK, PK, alpha, pi, beta).
RFC9381_TAI = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
     "",
     "8657106690b5526245a92b003bb079ccd1a92130477671f6fc01ad16f26f723f"
     "26f8a57ccaed74ee1b190bed1f479d9727d2d0f9b005a6e456a35d4fb0daab12"
     "68a1b0db10836d9826a528ca76567805",
     "90cf1df3b703cce59e2a35b925d411164068269d7b2d29f3301c03dd757876ff"
     "66b71dda49d2de59d03450451af026798e8f81cd2e333de5cdf4f3e140fdd8ae"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
     "72",
     "f3141cd382dc42909d19ec5110469e4feae18300e94f304590abdced48aed593"
     "3bf0864a62558b3ed7f2fea45c92a465301b3bbf5e3e54ddf2d935be3b67926d"
     "a3ef39226bbc355bdc9850112c8f4b02",
     "eb4440665d3891d668e7e0fcaf587f1b4bd7fbfe99d0eb2211ccec90496310eb"
     "5e33821bc613efb94db5e5b54c70a848a0bef4553a41befc57663b56373a5031"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
     "af82",
     "9bc0f79119cc5604bf02d23b4caede71393cedfbb191434dd016d30177ccbf80"
     "96bb474e53895c362d8628ee9f9ea3c0e52c7a5c691b6c18c9979866568add7a"
     "2d41b00b05081ed0f58ee5e31b3a970e",
     "645427e5d00c62a23fb703732fa5d892940935942101e456ecca7bb217c61c45"
     "2118fec1219202a0edcf038bb6373241578be7217ba85a2687f7a0310b2df19f"),
]
VECTORS = [tuple(bytes.fromhex(x) for x in v) for v in RFC9381_TAI]

# Points of small order, derivable by hand: the identity (y = 1), (0, -1) of order 2 (y = p - 1),
# and (sqrt(-1), 0) of order 4 (y = 0).
P = (1 << 255) - 19
IDENTITY = (1).to_bytes(32, "little")
ORDER2 = (P - 1).to_bytes(32, "little")
ORDER4 = bytes(32)
SMALL_ORDER = [IDENTITY, ORDER2, ORDER4]


@pytest.mark.parametrize("sk,pk,alpha,pi,beta", VECTORS)
def test_rfc9381_vectors(sk: bytes, pk: bytes, alpha: bytes, pi: bytes, beta: bytes) -> None:
    assert vrf.public_key(sk) == pk
    assert vrf.prove(sk, alpha) == pi
    assert vrf.proof_to_hash(pi) == beta
    assert vrf.verify(pk, alpha, pi) == beta


def test_public_key_matches_libsodium_ed25519() -> None:
    for i in range(5):
        seed = hashlib.sha256(b"seed %d" % i).digest()
        pk, _ = sodium.crypto_sign_seed_keypair(seed)
        assert vrf.public_key(seed) == pk


def test_roundtrip_many_inputs() -> None:
    sk = hashlib.sha256(b"validator").digest()
    pk = vrf.public_key(sk)
    outputs = set()
    for i in range(20):
        alpha = b"epoch %d" % i
        pi = vrf.prove(sk, alpha)
        outputs.add(vrf.verify(pk, alpha, pi))
    assert len(outputs) == 20


def test_encode_to_curve_lands_in_the_prime_order_subgroup() -> None:
    pk = VECTORS[0][1]
    for i in range(64):  # about half the inputs need more than one try
        h = vrf._encode_to_curve(pk, b"%d" % i)
        assert sodium.crypto_core_ed25519_is_valid_point(h)


def test_hash_to_point_refuses_non_canonical_and_off_curve() -> None:
    assert vrf._hash_to_point((P + 1).to_bytes(32, "little")) is None  # y = 1 encoded as p + 1
    assert vrf._hash_to_point(IDENTITY[:31] + b"\x80") is None  # x = 0 with the sign bit set
    misses = sum(vrf._hash_to_point(hashlib.sha256(b"%d" % i).digest()) is None for i in range(200))
    assert 60 < misses < 140  # about half of all y are not on the curve


# --------------------------------------------------------------------------- forged and malformed


def _sk_pk_alpha_pi() -> tuple[bytes, bytes, bytes, bytes]:
    sk, pk, alpha, pi, _ = VECTORS[1]
    return sk, pk, alpha, pi


@pytest.mark.parametrize("length", [0, 79, 81, 160])
def test_wrong_length_proof_refused(length: int) -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    with pytest.raises(vrf.VrfError, match="80 bytes"):
        vrf.verify(pk, alpha, (pi * 2)[:length])


def test_non_canonical_scalar_refused() -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    s = int.from_bytes(pi[48:], "little")
    forged = pi[:48] + (s + vrf.L).to_bytes(32, "little")  # same scalar mod L
    with pytest.raises(vrf.VrfError, match="not canonical"):
        vrf.verify(pk, alpha, forged)


@pytest.mark.parametrize("gamma", SMALL_ORDER)
def test_small_order_gamma_refused(gamma: bytes) -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    with pytest.raises(vrf.VrfError, match="Gamma"):
        vrf.verify(pk, alpha, gamma + pi[32:])


def test_gamma_with_torsion_component_refused() -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    mixed = sodium.crypto_core_ed25519_add(pi[:32], ORDER4)  # same 8*Gamma, so the same output
    with pytest.raises(vrf.VrfError, match="Gamma"):
        vrf.verify(pk, alpha, mixed + pi[32:])


def test_non_canonical_gamma_refused() -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    with pytest.raises(vrf.VrfError, match="Gamma"):
        vrf.verify(pk, alpha, (P + 1).to_bytes(32, "little") + pi[32:])


@pytest.mark.parametrize("key", [*SMALL_ORDER, (P + 1).to_bytes(32, "little"), b"\x01" * 31])
def test_bad_public_key_refused(key: bytes) -> None:
    _, _, alpha, pi = _sk_pk_alpha_pi()
    with pytest.raises(vrf.VrfError, match="public key"):
        vrf.verify(key, alpha, pi)


def test_wrong_key_wrong_input_and_flipped_bits_refused() -> None:
    _, pk, alpha, pi = _sk_pk_alpha_pi()
    other_pk = VECTORS[2][1]
    with pytest.raises(vrf.VrfError, match="does not verify"):
        vrf.verify(other_pk, alpha, pi)
    with pytest.raises(vrf.VrfError, match="does not verify"):
        vrf.verify(pk, alpha + b"!", pi)
    for byte in (32, 40, 47, 48, 60):  # c and s (s stays below L: its top byte is untouched)
        forged = bytearray(pi)
        forged[byte] ^= 1
        with pytest.raises(vrf.VrfError):
            vrf.verify(pk, alpha, bytes(forged))


def test_another_keys_gamma_with_valid_c_s_refused() -> None:
    """A proof assembled from another key's Gamma (a different output) does not verify."""
    sk, pk, alpha, pi = _sk_pk_alpha_pi()
    other = vrf.prove(VECTORS[2][0], alpha)
    with pytest.raises(vrf.VrfError, match="does not verify"):
        vrf.verify(pk, alpha, other[:32] + pi[32:])


def test_secret_key_length_checked() -> None:
    with pytest.raises(vrf.VrfError, match="32 bytes"):
        vrf.prove(b"short", b"")


# --------------------------------------------------------------------------- leader election


def _validators(n: int, powers: list[int] | None = None) -> tuple[dict[bytes, int], dict[bytes, bytes]]:
    keys = {}
    for i in range(n):
        sk = hashlib.sha256(b"validator %d" % i).digest()
        keys[vrf.public_key(sk)] = sk
    powers = powers or [10] * n
    return {pk: p for pk, p in zip(keys, powers, strict=True)}, keys


def _proofs(keys: dict[bytes, bytes], epoch: int, prev: bytes) -> dict[bytes, bytes]:
    alpha = vrf.leader_alpha(epoch, prev)
    return {pk: vrf.prove(sk, alpha) for pk, sk in keys.items()}


def test_leader_is_deterministic_and_order_free() -> None:
    validators, keys = _validators(4)
    prev = hashlib.sha256(b"commit").digest()
    proofs = _proofs(keys, 7, prev)
    leader = vrf.leader_for_epoch(validators, 7, prev, proofs)
    assert leader is not None and leader.pk in validators
    reversed_proofs = dict(reversed(list(proofs.items())))
    assert vrf.leader_for_epoch(dict(reversed(list(validators.items()))), 7, prev, reversed_proofs) == leader
    ranked = vrf.rank_validators([vrf.LeaderClaim(pk, validators[pk], vrf.verify(pk, vrf.leader_alpha(7, prev), pi))
                                  for pk, pi in proofs.items()])
    assert ranked[0] == leader and len(ranked) == 4


def test_leader_changes_with_the_commit_hash() -> None:
    validators, keys = _validators(4)
    leaders = set()
    for i in range(40):
        prev = hashlib.sha256(b"commit %d" % i).digest()
        leader = vrf.leader_for_epoch(validators, i, prev, _proofs(keys, i, prev))
        assert leader is not None
        leaders.add(leader.pk)
    assert leaders == set(validators)


def test_invalid_and_foreign_proofs_do_not_run() -> None:
    validators, keys = _validators(4)
    prev = hashlib.sha256(b"commit").digest()
    proofs = _proofs(keys, 3, prev)
    winner = vrf.leader_for_epoch(validators, 3, prev, proofs)
    assert winner is not None
    # the winner's proof is replaced by one for another epoch: it no longer runs
    stale = dict(proofs)
    stale[winner.pk] = _proofs({winner.pk: keys[winner.pk]}, 4, prev)[winner.pk]
    second = vrf.leader_for_epoch(validators, 3, prev, stale)
    assert second is not None and second.pk != winner.pk
    # an outsider's valid proof and a zero-power validator's proof are ignored
    outsider_sk = hashlib.sha256(b"outsider").digest()
    outsider = {vrf.public_key(outsider_sk): outsider_sk}
    only_outsider = _proofs(outsider, 3, prev)
    assert vrf.leader_for_epoch(validators, 3, prev, only_outsider) is None
    zero = dict(validators)
    zero[winner.pk] = 0
    assert vrf.leader_for_epoch(zero, 3, prev, proofs) == second
    assert vrf.leader_for_epoch(validators, 3, prev, {}) is None
    garbage = {pk: b"\x00" * 80 for pk in validators}
    assert vrf.leader_for_epoch(validators, 3, prev, garbage) is None


def test_leader_chance_follows_power() -> None:
    """Power 3 against power 1: the heavy validator leads about 3/4 of the epochs (exponential
    race). Deterministic: the VRF outputs are fixed by the keys and the inputs."""
    validators, keys = _validators(2, [3, 1])
    heavy = next(pk for pk, p in validators.items() if p == 3)
    wins = 0
    n = 400
    for e in range(n):
        prev = hashlib.sha256(b"c%d" % e).digest()
        leader = vrf.leader_for_epoch(validators, e, prev, _proofs(keys, e, prev))
        assert leader is not None
        wins += leader.pk == heavy
    assert 270 <= wins <= 330  # 300 expected, sd 8.7; plain u/power would give 333


def test_neg_log2_fixed_point() -> None:
    one = 1 << vrf._LOG_BITS
    assert vrf._neg_log2(b"\xff" * 32) == 0  # u = 1
    assert vrf._neg_log2(bytes(32)) == 256 * one  # u = 2^-256
    assert vrf._neg_log2(b"\x7f" + b"\xff" * 31) == one  # u = 1/2
    assert abs(vrf._neg_log2(b"\x3f" + b"\xff" * 31) - 2 * one) <= 1
    # u = 3/4: -log2(0.75) = 0.415037499278843...
    assert abs(vrf._neg_log2(b"\xbf" + b"\xff" * 31) / one - 0.415037499278843818) < 1e-15


@settings(max_examples=25, deadline=None)
@given(sk=st.binary(min_size=32, max_size=32), alpha=st.binary(max_size=64), junk=st.binary(min_size=80, max_size=80))
def test_roundtrip_and_random_proofs_refused(sk: bytes, alpha: bytes, junk: bytes) -> None:
    pk = vrf.public_key(sk)
    pi = vrf.prove(sk, alpha)
    assert vrf.verify(pk, alpha, pi) == vrf.proof_to_hash(pi)
    if junk != pi:
        with pytest.raises(vrf.VrfError):
            vrf.verify(pk, alpha, junk)
