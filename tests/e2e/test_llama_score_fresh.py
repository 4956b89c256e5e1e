"""Scores verifiers agree on (issue 14): a reply's score does not depend on what the engine scored
before, with ``score_fresh`` (what ``gentorrent verifier --audit`` uses) and without it. Reused
cached prefixes used to change scores: a placement in a batch restored a snapshot into a sequence
another placement was still copying from (llama.cpp applies stream copies at the next decode), so
that placement got wrong KV (model_node/llama/kv_cache.py ``KvCache.place``)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from verifier.audit.challenges import ChallengeGenerator
from verifier.audit.reputation import to_fixed
from verifier.audit.scoring import score_reply

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")


def _engine(**kw: Any) -> Any:
    model_id, path = llama.resolve_model(None)
    return llama.LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=4, n_ctx=2048, **kw)


@pytest.fixture(scope="module")
def replies() -> tuple[list[Any], list[int]]:
    """12 challenge replies and each one's score alone on a fresh engine (the reference), made once
    for both variants of the test."""

    async def main() -> tuple[list[Any], list[int]]:
        gen = _engine()
        model_id = gen.model
        g = ChallengeGenerator(rng=random.Random(11))
        items = []
        for _ in range(12):
            op = g.opening(model_id)
            prompt = gen.chat_prompt(op.messages)
            ids: list[int] = []
            async for piece in gen.generate(prompt, op.params):
                ids += piece.token_ids
            items.append((prompt, ids, op.params))
        gen.close()
        ref = []
        for it in items:  # each reply alone on a fresh engine
            e = _engine()
            ref.append(to_fixed(score_reply(await e.score(*it)).calibrated))
            e.close()
        return items, ref

    return trio.run(main)


@pytest.mark.parametrize("fresh", [True, False])
def test_scores_do_not_depend_on_the_engines_history(fresh: bool, replies: tuple[list[Any], list[int]]) -> None:
    items, ref = replies

    async def main() -> None:
        eng = _engine(score_fresh=fresh)
        rng = random.Random(3)
        for _ in range(8):  # random mixes of single and batched calls over overlapping replies
            ks = rng.sample(range(len(items)), rng.choice([1, 3, 4, 6]))
            if len(ks) == 1 or rng.random() < 0.3:
                got = [to_fixed(score_reply(await eng.score(*items[k])).calibrated) for k in ks]
            else:
                got = [to_fixed(score_reply(s).calibrated) for s in await eng.score_batch([items[k] for k in ks])]
            assert got == [ref[k] for k in ks]
        eng.close()

    trio.run(main)
