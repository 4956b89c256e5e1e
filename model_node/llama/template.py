"""A model's chat template and tokens: the template from the GGUF metadata
(``tokenizer.chat_template``) rendered with jinja2 (sandboxed, as Hugging Face does) and
tokenized here, so token ids flow end to end. Template text may hold control tokens
(``<|im_start|>``), message contents and the failover continuation never do (a user typing
``<|im_end|>`` gets the characters, not the control token). Also the text of generated tokens
(whole pieces, in bytes), end-of-generation tokens and the vocabulary check."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from model_node.engine import EngineError
from overlay.wire.messages import ChatMessage

log = logging.getLogger("gentorrent.llama")


def _load_template(L: Any, model: Any, model_file: str) -> Any:
    """The model's chat template, compiled in a sandbox with the helpers templates call."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    raw = L.llama_model_chat_template(model, None)
    if not raw:
        raise EngineError(f"{model_file} has no chat template in its GGUF metadata "
                          "(tokenizer.chat_template)")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message: str) -> None:
        raise EngineError(f"chat template: {message}")

    import json

    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda f: time.strftime(f))
    return env.from_string(raw.decode())


class ChatTokens:
    """The vocabulary and chat template of a loaded llama.cpp ``model`` (``model_file``: its file
    name, for errors). Raises :class:`EngineError` if the model has no chat template."""

    def __init__(self, L: Any, model: Any, model_file: str) -> None:
        self._L = L
        self._vocab = L.llama_model_get_vocab(model)
        self.n_vocab: int = L.llama_vocab_n_tokens(self._vocab)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._template = _load_template(L, model, model_file)
        self._bos = L.llama_vocab_bos(self._vocab)
        self._add_bos = bool(L.llama_vocab_get_add_bos(self._vocab)) and self._bos >= 0
        self._end: tuple[int | None] | None = None  # end_token(), found at its first call

    def _token_text(self, tok: int) -> str:
        return self._L.llama_vocab_get_text(self._vocab, tok).decode(errors="replace") if tok >= 0 else ""

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``special``: parse control-token text (template parts only)."""
        data = text.encode()
        if not data:
            return []
        cap = len(data) + 8
        while True:
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        """The template is rendered with a unique marker in place of each message's content;
        template text is tokenized with control tokens, contents (and ``continuation``) as
        plain text. Should a template alter the markers, the whole rendering is tokenized with
        control tokens (as Hugging Face's ``apply_chat_template`` does)."""
        tag = os.urandom(6).hex()
        marks = [f"\ue000{tag}{i}\ue001" for i in range(len(messages))]
        text = self._render([{"role": m.role, "content": mk} for m, mk in zip(messages, marks, strict=True)])
        pieces, pos = [], 0
        for m, mk in zip(messages, marks, strict=True):
            at = text.find(mk, pos)
            if at < 0 or text.count(mk) != 1:
                break
            pieces.append((text[pos:at], m.content))
            pos = at + len(mk)
        else:
            ids: list[int] = []
            for template_text, content in pieces:
                ids += self.tokenize(template_text, special=True) + self.tokenize(content)
            ids += self.tokenize(text[pos:], special=True)
            return self._with_bos(ids) + self.tokenize(continuation)
        log.debug("chat template transforms message contents; tokenizing its rendering as a whole")
        text = self._render([{"role": m.role, "content": m.content} for m in messages])
        return self._with_bos(self.tokenize(text, special=True)) + self.tokenize(continuation)

    def _render(self, messages: list[dict[str, str]]) -> str:
        try:
            text: str = self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self._token_text(self._bos),
                eos_token=self._token_text(self._L.llama_vocab_eos(self._vocab)),
            )
            return text
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise EngineError(f"chat template failed: {exc}") from None

    def _with_bos(self, ids: list[int]) -> list[int]:
        return [self._bos, *ids] if self._add_bos and (not ids or ids[0] != self._bos) else ids

    def piece(self, tok: int) -> bytes:
        """The bytes of token ``tok`` (part of a UTF-8 character, possibly)."""
        n = self._L.llama_token_to_piece(self._vocab, tok, self._piece_buf, 256, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, tok, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in token_ids).decode(errors="replace")

    def end_token(self) -> int | None:
        """The token that ends an assistant's turn: the first token the chat template puts after an
        assistant message's content when it is an end-of-generation token (SmolLM2's
        ``<|im_end|>``, not its end-of-sequence ``<|endoftext|>``); else the vocabulary's
        end-of-turn token, else its end-of-sequence token; None when it has none of them. Found once
        (the template is rendered at the first call), then kept."""
        if self._end is None:
            self._end = (self._find_end_token(),)
        return self._end[0]

    def _find_end_token(self) -> int | None:
        mark = f"\ue000{os.urandom(6).hex()}\ue001"
        try:
            text = self._render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}])
        except EngineError:
            text = ""
        after = text.split(mark, 1)[1] if text.count(mark) == 1 else ""
        first = self.tokenize(after, special=True)[:1]
        if first and self.is_eog(first[0]):
            return first[0]
        for tok in (self._L.llama_vocab_eot(self._vocab), self._L.llama_vocab_eos(self._vocab)):
            if 0 <= tok < self.n_vocab:
                return int(tok)
        return None

    def is_eog(self, tok: int) -> bool:
        """Whether ``tok`` ends generation (any end-of-generation token of the vocabulary)."""
        return bool(self._L.llama_vocab_is_eog(self._vocab, tok))

    def check_ids(self, ids: Sequence[int]) -> None:
        """:class:`EngineError` for the first id outside the vocabulary, if any."""
        bad = next((t for t in ids if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise EngineError(f"token id {bad} is outside the model's vocabulary of {self.n_vocab}")
