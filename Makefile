# autotune: `make run` tunes Llama 3.1 405B on the simulated backend; `make test` runs the tests.
# Each target installs what it needs into .venv first (idempotent: a stamp file skips the work when
# pyproject.toml has not changed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.autotune-installed
TORCH  ?= torch==2.13.0

.PHONY: install run test ci bench fidelity clean

install: $(STAMP)

# torch first, pinned: on these machines it resolves to the local CPU wheel (a bare `torch` requirement
# would pull a multi-GB CUDA build); then the package in editable mode with its test, postgres and
# torchtitan extras (psycopg 3 for the PostgreSQL tests; torchtitan + triton + torchao so the exported
# torchtitan config is loaded by torchtitan's own ConfigManager, tests/export/test_export.py). .ci/run starts PostgreSQL and a single-node Slurm around `make
# test` (.ci/services.sh); without them those tests skip, saying why.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test,postgres,torchtitan]'
	touch $(STAMP)

run: install
	$(BIN)/autotune run --size 405b
	@echo ""
	@echo "autotune is installed in $(VENV). To use the README's commands (bare \`autotune\`):"
	@echo "  . $(VENV)/bin/activate        # then: autotune show, autotune export --size 405b -o plan.yaml, ..."
	@echo "or call it by path:  $(BIN)/autotune show"

# two pytest-xdist workers, whole files per worker (--dist loadfile: a file's tests share their services and
# fixtures in one process): on a 2-core machine the suite took 675 s instead of 1,192 s, both while other jobs
# loaded the machine (2026-12-02); most tests wait on subprocesses (torchrun, workers, signals)
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# what CI runs: PostgreSQL on 127.0.0.1 and a single-node Slurm started (as root, Debian packages), then
# `make test` with them, then both stopped (.ci/run, .ci/services.sh)
ci:
	bash .ci/run

# CPU benchmarks; bench/bench_real.py and bench/fidelity.py need a GPU host (see README).
bench: install
	$(BIN)/python bench/bench_simulator.py
	$(BIN)/python bench/published.py
	$(BIN)/python bench/bench_tuner.py
	$(BIN)/python bench/bench_run_cpu.py --runs 1
	$(BIN)/python bench/bench_plan.py

# GPU host with 2 GPUs and this package's dependencies in $(PY): profile into a fresh store, the
# measured evaluator's predictions, every fidelity plan run for real -> the table in docs/fidelity.md
PY ?= python3
FIDELITY_DB ?= studies/fidelity-ops.db
fidelity:
	rm -f $(FIDELITY_DB)
	$(PY) -m autotune profile --quick --tiers nvlink --storage sqlite:///$(FIDELITY_DB)
	$(PY) bench/fidelity.py --predict-measured studies/fidelity-measured.json --storage sqlite:///$(FIDELITY_DB)
	$(PY) bench/fidelity.py --warmup 1 --steps 3 --measured studies/fidelity-measured.json \
		--json studies/fidelity.json --markdown docs/fidelity.md

clean:
	rm -rf $(VENV)
