"""`gentorrent user serve` as a process, over a network of relay and model-node processes, driven
by the official openai client: a chat, a streamed chat, a completion, and each error."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gentorrent.tools.localnet import LocalNet, cli, free_ports
from model_node.echo import EchoEngine
from overlay.wire.messages import ChatMessage

pytestmark = pytest.mark.slow


class Gateway:
    def __init__(self, net: LocalNet, *extra: str) -> None:
        config = net.config_toml("you", net.root / "you.toml")
        self.port = free_ports(1)[0]
        self.log = net.root / "gateway.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cli("user", "serve", "--config", str(config), "--port", str(self.port), "--cloves", "3",
                    "--threshold", "2", "--proxies", "3", *extra),
                stdout=log, stderr=log, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=60)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while b"READY http" not in self.log.read_bytes():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def error_body(e: openai.APIError) -> dict[str, Any]:
    """The error object the gateway answered with (the SDK types ``body`` as ``object``)."""
    assert isinstance(e.body, dict), e.body
    return e.body


def text_of(m: ChatCompletionMessageParam) -> str:
    """A message's content, where it is plain text."""
    content = m.get("content")
    assert isinstance(content, str), content
    return content


def make_net(root: Path, relays: int, **kw) -> LocalNet:
    return LocalNet(root, relays, users=("you",), **kw)


def test_openai_client_through_the_anonymous_overlay(tmp_path):
    with make_net(tmp_path, 9, echo_delay=0.01) as net:
        net.start()
        gw = Gateway(net)
        try:
            gw.wait_ready()
            c = gw.client
            assert [m.id for m in c.models.list().data] == ["echo"]
            first: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello through nine relays"}]
            r = c.chat.completions.create(model="echo", messages=first, temperature=0, seed=7)
            assert r.choices[0].message.content == "hello through nine relays"
            assert r.usage is not None
            assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len("hello through nine relays")
            prompt_tokens = len(EchoEngine().chat_prompt([ChatMessage("user", "hello through nine relays")]))
            assert r.usage.prompt_tokens == prompt_tokens  # counted by the model node, carried back in its reply
            assert r.usage.total_tokens == prompt_tokens + r.usage.completion_tokens
            follow: list[ChatCompletionMessageParam] = [
                *first, {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": "second turn streamed word by word STOP not shown"}]
            parts = list(c.chat.completions.create(model="echo", messages=follow, stream=True, stop=[" STOP"],
                                                   stream_options={"include_usage": True}))
            text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
            assert text == "second turn streamed word by word"
            usage = parts[-1].usage
            assert usage is not None and usage.prompt_tokens == len(EchoEngine().chat_prompt(
                [ChatMessage(m["role"], text_of(m)) for m in follow]))
            assert sum(1 for p in parts if p.choices and p.choices[0].delta.content) >= 2  # streamed
            comp = c.completions.create(model="echo", prompt="one two three four", max_tokens=2)
            assert comp.choices[0].text == "one two" and comp.choices[0].finish_reason == "length"

            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(model="gpt-4o", messages=first)
            with pytest.raises(openai.BadRequestError) as bad:
                c.chat.completions.create(model="echo", messages=first, temperature=3)
            assert error_body(bad.value)["param"] == "temperature"
        finally:
            gw.stop()


def test_503_when_no_model_node_answers_or_too_few_paths(tmp_path):
    with make_net(tmp_path, 9) as net:
        net.start(names=net.relays)  # the registry lists a model node that never starts
        gw = Gateway(net, "--timeout", "2", "--paths-timeout", "15")
        try:
            gw.wait_ready()
            with pytest.raises(openai.APIStatusError) as e:
                gw.client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "anyone?"}])
            assert e.value.status_code == 503 and error_body(e.value)["code"] == "no_model_node_reachable"
        finally:
            gw.stop()
    with make_net(tmp_path / "few", 4) as net:
        net.start(names=[*net.models, *net.relays[:2]])  # 2 relays: no path of 3 distinct relays
        gw = Gateway(net, "--paths-timeout", "1")
        try:
            gw.wait_ready()
            with pytest.raises(openai.APIStatusError) as e:
                gw.client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "anyone?"}],
                                                  stream=True)
            assert e.value.status_code == 503 and error_body(e.value)["code"] == "not_enough_paths"
        finally:
            gw.stop()


def test_gateway_refuses_a_public_address_unless_told(tmp_path):
    with make_net(tmp_path, 4) as net:
        config = net.config_toml("you", net.root / "you.toml")
        r = subprocess.run(cli("user", "serve", "--config", str(config), "--host", "0.0.0.0"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--listen-public" in r.stderr


def test_openai_client_with_the_real_smollm2_model(tmp_path):
    llama = pytest.importorskip("model_node.llama")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")
    with make_net(tmp_path, 9, engine="llama.cpp", model=llama.DEFAULT_MODEL_ID, model_args=("--threads", "1")) as net:
        net.start(timeout=120)
        gw = Gateway(net)
        try:
            gw.wait_ready()
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": "What is the capital of France? Answer in one word."}]
            r = gw.client.chat.completions.create(model=llama.DEFAULT_MODEL_ID, messages=messages, max_tokens=16,
                                                  temperature=0, seed=1)
            assert "Paris" in (r.choices[0].message.content or "")
            assert r.usage is not None
            assert 1 <= r.usage.completion_tokens <= 16
            assert 10 <= r.usage.prompt_tokens <= 200  # the question in SmolLM2's chat template
            streamed = "".join(p.choices[0].delta.content or "" for p in gw.client.chat.completions.create(
                model=llama.DEFAULT_MODEL_ID, messages=messages, max_tokens=16, temperature=0, seed=1, stream=True))
            assert streamed == r.choices[0].message.content  # greedy: the same reply, streamed
        finally:
            gw.stop()
