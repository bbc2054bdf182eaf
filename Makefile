# make demo / make test work on a fresh machine with Python 3.11+ and Java 17: both create
# .venv and install the package with every extra first (test; spark: pyspark, which also ships
# the ZooKeeper jar the tests run; tiering: fsspec/s3fs; archive: pyiceberg); the broker alone
# needs none of them.
# The install is redone only when pyproject.toml changes (the stamp file .venv/.installed is
# older than it).

SHELL := bash
BOOT_PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: venv install demo test lint bench bench-spark bench-tiering clean

venv: $(PY)

$(PY):
	@test -n "$(BOOT_PYTHON)" || { echo "error: python3.11 or python3 is needed" >&2; exit 1; }
	@$(BOOT_PYTHON) -c "import sys; sys.exit(sys.version_info < (3, 11))" || \
		{ echo "error: $(BOOT_PYTHON) is older than Python 3.11" >&2; exit 1; }
	$(BOOT_PYTHON) -m venv $(VENV)

install: $(STAMP)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --config-settings editable_mode=compat -e '.[test,spark,tiering,archive]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/logstore demo

# pytest's exit code 5 ("no tests collected") fails too: a suite that runs nothing is broken.
test: install
	PYSPARK_PYTHON="$(abspath $(PY))" $(PY) -m pytest -q tests $(PYTEST_ARGS)

# ruff over everything; mypy --strict over the core, the Spark source and the jobs.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict logstore datasource jobs

bench: install
	$(PY) benchmarks/produce_consume.py $(BENCH_ARGS)

# One local[2] Spark session; its Python workers run on the venv's interpreter.
bench-spark: install
	PYSPARK_PYTHON="$(abspath $(PY))" $(PY) benchmarks/spark_read.py $(BENCH_ARGS)

# Tiering against moto's S3 server (its own process) and raw s3fs; Spark for the last figures.
bench-tiering: install
	PYSPARK_PYTHON="$(abspath $(PY))" $(PY) benchmarks/tiering.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
