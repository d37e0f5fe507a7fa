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

.PHONY: quickstart test install data data-docs notebooks results clean gpu-image-check

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -c '$(PY_OK)' 2>/dev/null || { echo "$(NO_PY)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,hf,track,notebooks]'
	touch $@

data: $(DATA) $(DIGITS)
$(DATA): | $(VENV)/.installed
	$(PY) data_scripts/prepare_shakespeare.py
$(DIGITS): | $(VENV)/.installed
	$(PY) data_scripts/prepare_digits.py

# A second corpus, >= 100M byte tokens of English documentation from pinned Debian 12 packages (apt-get download,
# about 90 MB; or built offline from data/raw/debian_docs.txt.xz): docs/data_and_layout.md. Not part of data or test.
data-docs: | $(VENV)/.installed
	$(PY) data_scripts/prepare_debian_docs.py

quickstart: install data
	$(PY) -m accellib.compare --config configs/tutorial.yaml --out runs/quickstart --overwrite

test: install data
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadfile -p no:cacheprovider tests notebooks \
	  --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900

# The results cache the notebooks read (results/*.json): multi-seed, equal-compute experiments on the
# tutorial baseline (with the dense frontier: tutorial_flops 52 min, its LR check 20 min, with 2 jobs on a busy
# 2-core machine; tutorial_frontier, the plain models that bracket its minimum, 44 min with 1 job), the papers'
# regime (configs/fixed_size_long.yaml: long_lr_sweep 50 min, long_flops 65 min (52 + 13 for the two smallest plain arms), long_timing
# 0.2 min, 2 jobs on a shared 2-core machine), the over-trained regime (configs/overtrained.yaml, on data-docs'
# corpus: benchmarks/overtrained.py) and the Ouroboros arms (configs/ouroboros.yaml);
# benchmarks/reproduce.py --jobs N uses N cores, and every experiment resumes where it stopped
results: install data data-docs
	$(PY) benchmarks/reproduce.py

# Re-execute every notebook in place so stored outputs are the CI-scale outputs nbval checks.
notebooks: install data
	$(PY) tests/execute_notebooks.py notebooks/*.ipynb

clean:
	rm -rf runs .pytest_cache

# The GPU image's versions, checked on this CPU (issue 34; run it before every change to the GPU path). A second,
# git-ignored environment with what a bare GPU box has: Python 3.12 when found (GPU_IMAGE_PYTHON=... to choose),
# torch 2.11.0 (PyPI's build is the CUDA 13.0 one, about 5 GB installed, and runs on a CPU), accelerate 1.15.0,
# transformers 5.17.0, triton, numpy, pyyaml, tqdm, matplotlib, pytest; not torchao, nbval, jupyterlab, lm-eval.
# Then, from the checkout with accellib NOT installed: every accellib module imports without what the image lacks,
# the GPU check's smoke mode runs, and a short training with train.compile=blocks (inductor, on the CPU) reaches
# the loss of the same training without compile. Not in .ci/run: the download and the CPU compile cost minutes.
GPU_IMAGE      := .venv-gpu-image
GPU_IMAGE_PY   := $(GPU_IMAGE)/bin/python
GPU_IMAGE_PKGS := torch==2.11.0 accelerate==1.15.0 transformers==5.17.0 numpy pyyaml tqdm matplotlib pytest
GPU_IMAGE_LACKS := torchao nbval jupyterlab lm_eval ipywidgets datasets
ifeq ($(origin GPU_IMAGE_PYTHON),undefined)
GPU_IMAGE_PYTHON := $(shell for p in python3.12 $(PYTHON); do \
            $$p -c '$(PY_OK)' 2>/dev/null && { command -v $$p; break; }; done)
endif
GPU_IMAGE_RUN  := runs/gpu_image_check
GPU_IMAGE_TRAIN := --config configs/tiny.yaml --train.steps=30 --train.eval_every=0 --train.checkpoint_every=0 \
                   --train.threads=1 --train.progress=false --train.log_every=10 --overwrite

$(GPU_IMAGE)/.installed:
	@test -n "$(GPU_IMAGE_PYTHON)" || { echo "error: no Python >= 3.11 for $(GPU_IMAGE) (tried python3.12 $(PYTHON)); the GPU image has 3.12: make gpu-image-check GPU_IMAGE_PYTHON=/path/to/python3.12" >&2; exit 1; }
	@df -h . | awk 'NR == 2 { print "gpu-image-check: " $$4 " free on this disk; the environment takes about 5 GB" }'
	test -x $(GPU_IMAGE_PY) || $(GPU_IMAGE_PYTHON) -m venv $(GPU_IMAGE)
	$(GPU_IMAGE_PY) -m pip install -q --disable-pip-version-check $(GPU_IMAGE_PKGS)
	touch $@

gpu-image-check: $(GPU_IMAGE)/.installed
	@test -f $(DATA) || { echo "gpu-image-check: $(DATA) is missing: run make data first" >&2; exit 1; }
	@! $(GPU_IMAGE_PY) -m pip show -q accellib 2>/dev/null || { echo "gpu-image-check: accellib is installed in $(GPU_IMAGE); the check runs the checkout: pip uninstall it there" >&2; exit 1; }
	$(GPU_IMAGE_PY) -c "import importlib, importlib.util as u, pkgutil, sys, torch, accellib; \
	  lacks = [m for m in '$(GPU_IMAGE_LACKS)'.split() if u.find_spec(m) is None]; \
	  mods = [m.name for m in pkgutil.walk_packages(accellib.__path__, 'accellib.')]; \
	  [importlib.import_module(m) for m in mods]; \
	  bad = [m for m in lacks if m in sys.modules]; assert not bad, bad; \
	  print(f'gpu-image-check: torch {torch.__version__}; {len(mods)} accellib modules import from the checkout ' \
	        f'without {\", \".join(lacks)}')"
	OMP_NUM_THREADS=1 PYTHON=$(GPU_IMAGE_PY) bash benchmarks/gpu_check.sh --smoke --out-dir $(GPU_IMAGE_RUN)
	$(GPU_IMAGE_PY) -m accellib.train $(GPU_IMAGE_TRAIN) --train.compile=none --out $(GPU_IMAGE_RUN)/compile_none
	$(GPU_IMAGE_PY) -m accellib.train $(GPU_IMAGE_TRAIN) --train.compile=blocks --out $(GPU_IMAGE_RUN)/compile_blocks
	$(GPU_IMAGE_PY) -c "import json; r = lambda c: json.load(open(f'$(GPU_IMAGE_RUN)/compile_{c}/record.json'))['final']['val_loss']; \
	  a, b = r('none'), r('blocks'); print(f'gpu-image-check: val_loss {a:.5f} without compile, {b:.5f} with train.compile=blocks'); \
	  assert abs(a - b) <= 1e-3, 'compiled training differs from eager by more than 1e-3'"
	@echo "gpu-image-check: passed"
