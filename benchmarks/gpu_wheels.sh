#!/usr/bin/env bash
# The wheels the GPU check needs that the GPU image lacks, fetched on a machine with a package index into .whl/
# (git-ignored) and copied to the GPU box with the checkout (the box has no network and no index):
#
#     bash benchmarks/gpu_wheels.sh          # -> .whl/torchao-<version>-...whl
#
# torchao gives the check's FP8 arm (lowp.backend=torchao: torchao.float8). The wheel is chosen for the image, not
# for this machine: Python 3.12, x86-64 Linux (manylinux), torch 2.11; TORCHAO_VERSION=... picks another release
# (0.17.0 is the one seen to import with torch 2.11.0+cu130). benchmarks/gpu_check.py installs whatever .whl/ holds
# into a temporary folder (pip install --no-index --no-deps --target) and skips the FP8 arm, in one line, without it.
# It also fetches the wheels benchmarks/notebooks_gpu.py (every notebook run on the GPU box) installs the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCHAO="${TORCHAO_VERSION:-0.17.0}"
mkdir -p .whl
start=$(date +%s)
"$PY" -m pip download --disable-pip-version-check --quiet --only-binary=:all: --no-deps \
    --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl "torchao==$TORCHAO"
# the notebook runner's wheels: what the notebooks import that the image lacks (IPython, ipywidgets; lm-eval for
# notebook 00's evaluation) with their own needs that the image lacks, at constraints.txt's pins. Three of them
# (rouge-score, sqlitedict, word2number) are published as sources only: pip builds their pure-Python wheels here.
NOTEBOOK_NEEDS="ipython ipython_pygments_lexers ipywidgets comm traitlets jedi parso matplotlib-inline pexpect ptyprocess
  prompt_toolkit wcwidth stack-data executing asttokens pure_eval widgetsnbextension jupyterlab_widgets
  lm_eval datasets evaluate dill multiprocess more-itertools pytablewriter DataProperty mbstrdecoder pathvalidate
  tabledata typepy chardet msgfy dominate logbook defusedxml truststore httpx2 httpcore2 tzdata nltk
  rouge-score sqlitedict word2number"
for name in $NOTEBOOK_NEEDS; do
    pin=$(grep -i -E "^${name//[-_]/[-_]}==" constraints.txt || true)
    [ -n "$pin" ] || { echo "gpu_wheels: $name has no pin in constraints.txt" >&2; exit 1; }
    "$PY" -m pip download --disable-pip-version-check --quiet --only-binary=:all: --no-deps \
        --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .whl "$pin" 2>/dev/null \
      || "$PY" -m pip wheel --disable-pip-version-check --quiet --no-deps -w .whl "$pin"
done
echo "gpu_wheels: .whl/ holds ($(( $(date +%s) - start )) s):"
ls -l .whl/*.whl | awk '{printf "  %-90s %6.1f MB\n", $NF, $5 / 1e6}'
echo "copy .whl/ into the checkout on the GPU machine; bash benchmarks/gpu_check.sh installs it in a temporary folder"
