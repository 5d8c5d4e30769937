# Every target sets itself up: a fresh machine needs only python3 (3.10+).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench fuzz clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,onnx-ir,fast]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/dmlgraph demo

test: $(STAMP)
	rm -rf build  # (a stale setuptools build/ would leak old modules into the wheel test)
	$(BIN)/python -m pytest

# The differential mask fuzzer's long soak: FUZZ_EXAMPLES examples per test (default 500), sizes up
# to FUZZ_MAX_SIZE (default 2049, past float16's integer limit); then the fuzzer of mask forms
# (tests/fuzz_forms.py), which prints the share of band sites lowered. Failures are kept in .hypothesis/
# and replayed first on the next run. Last the fuzzer of size chains (tests/fuzz_sizes.py, sizes to 160
# unless FUZZ_MAX_SIZE), which prints its counts and every failing model instead of stopping at one.
fuzz: $(STAMP)
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-500} FUZZ_MAX_SIZE=$${FUZZ_MAX_SIZE:-2049} \
		$(BIN)/python -m pytest tests/test_fuzz_masks.py -rxX
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-500} $(BIN)/python -m pytest tests/test_fuzz_forms.py -rxX -s
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-500} FUZZ_COLLECT=1 $(BIN)/python -m pytest tests/test_fuzz_sizes.py -rxX -s

# Both suites and the goals table (several minutes; writes 2 GiB to a temporary folder).
bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
