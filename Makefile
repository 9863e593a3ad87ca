# Two entry points for a fresh machine with Python 3.11: `make demo` and `make test`.
# Each creates .venv on first use. torch==2.13.0 is installed first, on its own, because
# that exact pin is a local CPU build; any other spec may pull a multi-GB CUDA build.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= out

.PHONY: venv demo test lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,plot,torch,ray]'
	touch $@

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

test: venv
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check pp_opt tests scripts examples
	$(BIN)/ruff format --check pp_opt tests scripts examples
	$(BIN)/mypy pp_opt

bench: venv
	$(BIN)/python scripts/bench_solvers.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache
