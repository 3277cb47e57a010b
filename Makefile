# Two commands for a fresh machine:  `make demo`  (set up + run the pipeline on the CPU default)
#                                    `make test`  (the test suite CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/cpu-small.yaml
TOOLKIT := $(BIN)/toolkit

.PHONY: setup setup-tools demo test test-slow test-fast model quantize engine repo serve stop sweep report clean

setup: $(VENV)/.installed

# Quiet: no version nag, no "scripts are not on PATH" or "running as root" notices (the venv is the point),
# and no warnings about a machine-wide pip config's index folders that are absent (-qq keeps errors).
PIP := $(BIN)/pip install -qq --disable-pip-version-check --no-warn-script-location --root-user-action=ignore

# torch first, pinned: 2.13.0 is the CPU build on these machines' disk; a bare `torch` would pull CUDA.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	touch $@

demo: setup
	$(TOOLKIT) demo --config $(CONFIG)

# Debian's promtool + prometheus and haproxy: the deploy tests (promtool check/test rules) and the
# autoscaling testbed run them; without them (not root, no apt) those tests skip, naming what is missing.
setup-tools:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v haproxy >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      prometheus haproxy >/dev/null; } || echo "setup-tools: could not install prometheus/haproxy; their tests will skip"

test: setup setup-tools
	$(BIN)/python -m pytest -q -rs -m "not slow"

# The minutes-long timed runs left out of `make test` (the autoscaling testbed ramp).
test-slow: setup setup-tools
	$(BIN)/python -m pytest -q -m slow

test-fast: setup
	$(BIN)/python -m pytest -q -m "not e2e and not slow"

# One stage at a time, each taking CONFIG=configs/<name>.yaml (make target → toolkit command)
STAGE_model  := init-model
STAGE_engine := build
model quantize engine repo serve stop sweep: setup
	$(TOOLKIT) $(or $(STAGE_$@),$@) --config $(CONFIG)
report: setup
	$(TOOLKIT) report

clean:
	rm -rf build/models build/checkpoints build/engines build/servers build/triton_backends model_repo/*/ perf/runs
