# Two commands for a fresh machine:  `make demo`  (set up + run the pipeline on the CPU default)
#                                    `make test`  (the test suite CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/cpu-small.yaml
TOOLKIT := $(BIN)/toolkit

.PHONY: setup demo test test-fast model quantize engine repo serve stop sweep report clean

setup: $(VENV)/.installed

# torch first, pinned: 2.13.0 is the CPU build on these machines' disk; a bare `torch` would pull CUDA.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: setup
	$(TOOLKIT) demo --config $(CONFIG)

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not e2e"

# One stage at a time, each taking CONFIG=configs/<name>.yaml (make target → toolkit command)
STAGE_model  := init-model
STAGE_engine := build
model quantize engine repo serve stop sweep: setup
	$(TOOLKIT) $(or $(STAGE_$@),$@) --config $(CONFIG)
report: setup
	$(TOOLKIT) report

clean:
	rm -rf build/models build/checkpoints build/engines build/servers build/triton_backends model_repo/*/ perf/runs
