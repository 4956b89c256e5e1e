# GenTorrent developer entry points. `make demo` and `make test` are the README's quick start.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
COMETBFT_VERSION := v0.38.26
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Installs the package (editable) with test tooling, and CometBFT for the verifier committee.
setup: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	@if GOBIN=$(CURDIR)/$(BIN) go install github.com/cometbft/cometbft/cmd/cometbft@$(COMETBFT_VERSION); then \
	    echo "cometbft $$($(BIN)/cometbft version) installed in $(BIN)"; \
	else \
	    echo "!!!! WARNING: 'go install cometbft@$(COMETBFT_VERSION)' FAILED: the verifier committee cannot run here !!!!"; \
	fi

# A local network of every part that exists, on loopback; Ctrl-C stops it.
demo: setup
	$(BIN)/gentorrent devnet --data-dir .devnet

# Everything except GPU tests (those skip cleanly without a GPU anyway).
test: setup
	$(BIN)/python -m pytest -m 'not gpu' $(PYTEST_ARGS)

bench: setup
	@for b in $$($(BIN)/gentorrent bench --list); do $(BIN)/gentorrent bench $$b --json; done

clean:
	rm -rf $(VENV) .devnet .pytest_cache .hypothesis
