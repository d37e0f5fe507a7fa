#!/usr/bin/env bash
# The GPU check (issues 34 and 42): one command on a machine with one NVIDIA GPU, from a bare checkout, within a
# deadline: each technique at fixed schedule points in steady state, each full-scale config's whole-run time
# predicted from them and checked against a short real run, every target of issue 42 with its measured value.
#
#     bash benchmarks/gpu_check.sh                        # <= 7 min; writes results/gpu_check_<gpu>.json
#     bash benchmarks/gpu_check.sh --deadline 300 --out-dir /scratch/gc
#     GPU_CHECK_DEADLINE=300 GPU_CHECK_OUT=/scratch/gc bash benchmarks/gpu_check.sh
#     bash benchmarks/gpu_check.sh --smoke                # the same parts at toy scale on a CPU
#
# Every argument goes to benchmarks/gpu_check.py (--help lists them; its docstring says what each part measures,
# benchmarks/gpu/ holds one module per part).
# The JSON is rewritten after every part, so a job killed at its time limit still leaves what was measured.
# The Python: $PYTHON, else the machine's python3 (no .venv, nothing installed: the check puts the checkout on
# sys.path; wheels the image lacks, such as torchao, come from .whl/, see benchmarks/gpu_wheels.sh).
#
# Exit status 1 with one line on stderr when the check cannot start: no such Python, no C compiler (Triton
# builds a C helper at the first torch.compile; not needed with --smoke), and, said by gpu_check.py, a Python
# without torch, no CUDA GPU visible to torch, or no Python.h for Triton's helper. Otherwise 0 with the JSON
# written, also when a target is missed or a part failed: the verdicts are in the JSON and on the console.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "gpu_check: no $PY found; install Python 3 with torch, or point PYTHON=/path/to/python3 at one" >&2
    exit 1
fi
smoke=0
for a in "$@"; do [ "$a" = "--smoke" ] && smoke=1; done
if [ "$smoke" = 0 ]; then   # the C compiler Triton takes: $CC, else gcc, else clang (triton/runtime/build.py)
    if [ -n "${CC:-}" ] && ! command -v "$CC" >/dev/null 2>&1; then
        echo "gpu_check: CC=$CC is not a command; Triton would use it at the first torch.compile: install it, or unset CC" >&2
        exit 1
    fi
    if [ -z "${CC:-}" ] && ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
        echo "gpu_check: no C compiler found (gcc, clang); Triton needs one at the first torch.compile: install gcc (e.g. apt-get install build-essential) or set CC" >&2
        exit 1
    fi
fi
exec "$PY" benchmarks/gpu_check.py "$@"
