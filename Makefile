# Two commands on a fresh machine:
#   make quickstart   create .venv, install, prepare the Shakespeare corpus, run the main job
#   make test         the whole test suite, notebooks included (what CI runs)
# The Python that creates .venv: >= 3.11 (constraints.txt pins versions that need it). Found among
# python3.11, python3.12, python3.13, python3 (the first that is >= 3.11), or: make PYTHON=/path/to/python3.11
PY_OK  := import sys; sys.exit(sys.version_info < (3, 11))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.11 python3.12 python3.13 python3; do \
            $$p -c '$(PY_OK)' 2>/dev/null && { command -v $$p; break; }; done)
endif
NO_PY  := error: no Python >= 3.11 (tried $(or $(PYTHON),python3.11 python3.12 python3.13 python3)): install one, then make PYTHON=/path/to/python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
DATA   := data/shakespeare/meta.json
DIGITS := data/digits/meta.json
# 2 cores: one torch thread per process keeps parallel test workers from oversubscribing
TEST_ENV := OMP_NUM_THREADS=1 PYTHONHASHSEED=0

.PHONY: quickstart test install data notebooks results clean

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -c '$(PY_OK)' 2>/dev/null || { echo "$(NO_PY)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,hf,track]'
	touch $@

data: $(DATA) $(DIGITS)
$(DATA): | $(VENV)/.installed
	$(PY) data_scripts/prepare_shakespeare.py
$(DIGITS): | $(VENV)/.installed
	$(PY) data_scripts/prepare_digits.py

quickstart: install data
	$(PY) -m accellib.compare --config configs/tutorial.yaml --out runs/quickstart --overwrite

test: install data
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadfile -p no:cacheprovider tests notebooks \
	  --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900

# The results cache the notebooks read (results/*.json): multi-seed, equal-compute experiments on the
# tutorial baseline (with the dense frontier: tutorial_flops 52 min, its LR check 20 min, with 2 jobs on a busy
# 2-core machine; tutorial_frontier, the plain models that bracket its minimum, 44 min with 1 job), the papers'
# regime (configs/fixed_size_long.yaml: long_lr_sweep 50 min, long_flops 65 min (52 + 13 for the two smallest plain arms), long_timing
# 0.2 min, 2 jobs on a shared 2-core machine) and the Ouroboros arms (configs/ouroboros.yaml);
# benchmarks/reproduce.py --jobs N uses N cores, and every experiment resumes where it stopped
results: install data
	$(PY) benchmarks/reproduce.py

# Re-execute every notebook in place so stored outputs are the CI-scale outputs nbval checks.
notebooks: install data
	$(PY) tests/execute_notebooks.py notebooks/*.ipynb

clean:
	rm -rf runs .pytest_cache
