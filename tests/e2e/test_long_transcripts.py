"""A user's transcript of any request a model node serves by default can be scored (decision 0032).

A node that has read the code knows the longest requests it serves, and would serve exactly
those cheaply if no verifier could score them. Model nodes serve in windows of 4,096 tokens; the
verifier's audit engine scored in 2,048, so any transcript of a longer request was logged as
"cannot score" and left out. Here a model node's engine, built as ``gentorrent model-node``
builds it, answers a request of over 2,048 tokens, and the verifier's audit engine, built as
``gentorrent verifier --audit`` builds it, scores the user's transcript of it."""

from __future__ import annotations

import pytest
import trio

from overlay.directory import transcripts as wire
from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")


def test_a_transcript_longer_than_2048_tokens_is_scored_by_the_verifiers_engine() -> None:
    from verifier.audit.loop import AuditSettings, _engine, score_tokens
    from verifier.audit.tx import Opening

    async def main() -> tuple[int, int, int]:
        model_id, path = llama.resolve_model(None)
        node = llama.LlamaCppEngine(path, model_id=model_id, n_threads=1)  # model_node/run.py's defaults
        paste = "".join(f"{i}: the pump at station {i % 7} reported pressure {i * 13 % 97} kPa.\n" for i in range(120))
        messages = (ChatMessage("user", f"Here is a log:\n{paste}\nWhich station reported the most?"),)
        params = SamplingParams(0.7, 1.0, 0, 48)
        prompt = node.chat_prompt(messages)
        ids: list[int] = []
        async for piece in node.generate(prompt, params):
            ids += piece.token_ids
        node.close()
        assert wire.fits(model_id, messages, params) is None  # a donor's client may hand it in
        verifier = _engine(AuditSettings())
        try:
            score, _, _ = await score_tokens(verifier, Opening(bytes(16), model_id, messages, params), ids,
                                             transcript=True)
        finally:
            verifier.close()
        return len(prompt), len(ids), score

    prompt_tokens, reply_tokens, score = trio.run(main)
    assert prompt_tokens + reply_tokens > 2048 and reply_tokens > 0
    assert score > 0  # an honest reply, scored by the verifier's own copy of the model
