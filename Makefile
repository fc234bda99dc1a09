PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned: this spec takes the local CPU wheel; anything looser downloads a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test test-fast lint bench ops cuda-check clean

install: $(BIN)/dslaunch
	@$(MAKE) --no-print-directory ops

$(BIN)/dslaunch: pyproject.toml setup.py dslaunch_as_deepspeed.pth
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	@touch $@

# Prebuild the compiled ops so a user's first run compiles nothing (no-op if none are defined yet).
ops:
	@if $(BIN)/python -c "import dslaunch.kernels.builder" 2>/dev/null; then $(BIN)/python -m dslaunch.kernels.builder --build-all; fi

cuda-check:
	@if [ -f cpp/cuda/Makefile.check ]; then $(MAKE) --no-print-directory -f cpp/cuda/Makefile.check; else echo "no CUDA sources yet"; fi

# pytest exit code 5 (no tests collected) must fail CI, and it does: we pass it through.
# TEST_WORKERS pytest-xdist workers, each test file whole on one of them; -x stops every worker at
# the first failure, -rfE names it again at the end. TEST_WORKERS=0: one process, no workers.
# tests/multihost/ runs after them, alone: two of its jobs fail at random beside two busy workers
# (a host lost during the shard-copy exchange after a step; a peer-lost error taken for the root
# cause over pdsh), bugs to fix, noted in docs/resilience.md's known limits.
TEST_WORKERS ?= 3
test:
	$(BIN)/python -m pytest -x -q -p no:cacheprovider --durations=20 -rfE -n $(TEST_WORKERS) --dist loadfile --ignore=tests/multihost tests
	$(BIN)/python -m pytest -x -q -p no:cacheprovider --durations=10 -rfE tests/multihost

test-fast:
	$(BIN)/python -m pytest -q -m "not slow and not multihost" tests

lint:
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q -x '/\.peer-venv/' dslaunch tests benchmarks examples

bench:
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_launch.py

clean:
	rm -rf build *.egg-info
