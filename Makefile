# Two entry points for a fresh machine with Python 3.11: `make demo` and `make test`
# (`make docs` builds the documentation site).
# Each creates .venv on first use: make demo installs pp_opt with its plots; make test and
# make lint add the rest. torch==2.13.0 is installed before them, on its own, because that
# exact pin is a local CPU build; any other spec may pull a multi-GB CUDA build.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= out
# torchtitan 0.3.0 for the end-to-end test (pytest -m torchtitan), in its own environment so
# that its dependencies never touch .venv; torch stays at 2.13.0 there too (constraints).
TT_VENV ?= .venv-torchtitan
TT_PIP  := $(TT_VENV)/bin/python -m pip install --quiet -c $(TT_VENV)/constraints.txt

.PHONY: venv test-venv torchtitan-venv demo test lint docs bench clean

venv: $(VENV)/.installed

test-venv: $(VENV)/.test-installed

torchtitan-venv: $(TT_VENV)/.installed

# torchtitan's declared dependencies but wandb (imported only when wandb logging is on), plus
# triton and rich, which it imports without declaring them.
$(TT_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(TT_VENV)
	echo "torch==2.13.0" > $(TT_VENV)/constraints.txt
	$(TT_PIP) torch==2.13.0
	$(TT_PIP) --no-deps torchtitan==0.3.0
	$(TT_PIP) torchdata torch_checkpointing "datasets>=3.6.0,<4.8.0" "tokenizers>=0.15.0" \
		safetensors tyro tensorboard einops pillow spmd_types==0.2.3 rich
	$(TT_PIP) --no-deps triton
	touch $@

# What make demo needs: pp_opt and matplotlib (its plots); the solvers come with pp_opt.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[plot]'
	touch $@

# What the tests and the lint need besides: torch (first, on its own), the dev tools, Ray,
# and megatron-core (its argument parser checks the printed Megatron-LM flags).
$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet torch==2.13.0
	echo "torch==2.13.0" > $(VENV)/constraints.txt
	$(BIN)/python -m pip install --quiet -c $(VENV)/constraints.txt -e '.[dev,plot,torch,ray]'
	$(BIN)/python -m pip install --quiet -c $(VENV)/constraints.txt megatron-core==0.16.1
	touch $@

# The documentation tools (the docs extra) on top of what make demo installs: mkdocs imports
# pp_opt's command line for its reference page, and reads the package's docstrings.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

# The site in site/, strict: a broken link, page or API reference fails the build. Run as
# `python -m mkdocs` from here, so that this checkout's pp_opt is the one documented.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

demo: venv
	mkdir -p $(OUT)
	$(BIN)/pp-opt compare examples/zb-1.5b.toml --time-limit 20
	$(BIN)/pp-opt solve examples/zb-1.5b.toml --objective span --time-limit 20 -o $(OUT)/zb-1.5b.json
	$(BIN)/pp-opt validate $(OUT)/zb-1.5b.json
	$(BIN)/pp-opt show $(OUT)/zb-1.5b.json
	$(BIN)/pp-opt export $(OUT)/zb-1.5b.json --format png -o $(OUT)/zb-1.5b.png
	$(BIN)/pp-opt export $(OUT)/zb-1.5b.json --format trace -o $(OUT)/zb-1.5b.trace.json
	$(BIN)/pp-opt export $(OUT)/zb-1.5b.json --format torch-csv -o $(OUT)/zb-1.5b.csv
	$(BIN)/pp-opt plan --model llama3-8b --hardware h100-80gb --gpus 4 --global-batch 16 \
		--seq 8192 --tp 1 --pp 4 --mbs 1 --time-limit 60 -o $(OUT)/plan.json \
		--schedule $(OUT)/plan-best.json --plot $(OUT)/plan.png
	$(BIN)/pp-opt validate $(OUT)/plan-best.json
	@echo "demo outputs in $(OUT)/"

# Two test workers (pytest-xdist), one per core of CI's 2; a module stays on one worker, so
# its module fixtures run once. The tests that hold a solve to its time limit within a second
# or so, or compare CPU timings measured apart (marker timing), run afterwards, alone.
# TEST_WORKERS=0 runs the rest in one process.
TEST_WORKERS ?= 2

test: test-venv torchtitan-venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m 'not fuzz and not timing'
	$(BIN)/python -m pytest -m 'timing and not fuzz'

lint: test-venv
	$(BIN)/ruff check pp_opt tests scripts examples
	$(BIN)/ruff format --check pp_opt tests scripts examples
	$(BIN)/mypy pp_opt

bench: venv
	$(BIN)/python scripts/bench_solvers.py

clean:
	rm -rf $(VENV) $(TT_VENV) $(OUT) site .pytest_cache .mypy_cache .ruff_cache
