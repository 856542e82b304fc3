.PHONY: install run test test-serial test-all test-fast check lint format bench clean images

VENV := .venv
BIN := $(VENV)/bin

install:
	bash scripts/install.sh

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh

# Set-up on first use, then serve on 127.0.0.1:8000 with the embedded defaults.
run: $(VENV)/.installed
	$(BIN)/rag-stream serve

# CI's suite: everything but the tests marked `extended` (docs/testing.md lists them),
# on two workers side by side (tests/support/lanes.py)
test:
	$(BIN)/pytest -q -m "not extended" -n 2 --durations=40

# the same, on one worker
test-serial:
	$(BIN)/pytest -q -m "not extended" --durations=40

# the whole suite, extended tests included (about 5 minutes more)
test-all:
	$(BIN)/pytest -q --durations=40

test-fast:
	$(BIN)/pytest -q tests/unit

check:
	$(BIN)/ruff check rag_stream tests scripts migrations
	$(BIN)/ruff format --check rag_stream tests scripts migrations
	$(BIN)/mypy rag_stream

format:
	$(BIN)/ruff check --fix rag_stream tests scripts migrations
	$(BIN)/ruff format rag_stream tests scripts migrations

# the API and vLLM CPU images, from a Debian base made here without a registry (docs/deploy.md);
# .venv first: it pins the images' dependencies
images: $(VENV)/.installed
	bash scripts/images.sh

clean:
	rm -rf .data .pytest_cache .mypy_cache .ruff_cache
