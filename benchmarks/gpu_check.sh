#!/usr/bin/env bash
# The GPU check of issue 15, one command on a machine with one NVIDIA GPU (80 GB for the default batch):
#
#     bash benchmarks/gpu_check.sh            (extra arguments go to gpu_check.py, e.g. --steps 200)
#
# 1. stops with one line (exit status 1) when torch sees no CUDA GPU;
# 2. python benchmarks/throughput.py --gpt2-small: trainer vs plain loop, compile off and on, with MFU
#    -> results/throughput_cuda.json;
# 3. python benchmarks/gpu_check.py: 1000-step GPT-2-small runs (bf16, train.compile=blocks, batch 16 x
#    grad_accum 4) of the baseline, pld, sbld, random_ltd, multilevel (the V-cycle; untied head),
#    standardization_loss, and lowp_fp8 (lowp.backend=torchao) when torchao is installed, in runs/gpu_check/;
#    their final records -> results/gpu_check_cuda.json; PASS/FAIL of the baseline's MFU >= 45%
#    (exit status 1 on FAIL or when an arm fails).
#
# Left out, and why:
#   layered_accumulation  its gain is each layer's all-reduce overlapping the backward, which needs several
#                         processes; on one GPU it also holds all 4 micro-batches' activations at once
#   pipeline              needs several processes (one per pipeline stage)
#   ouroboros             needs 2+ processes; on one process it is the exact single-process reference
#   lowp (emulate)        exact emulation rounds every product in software: about 1 s per step already for a
#                         2-layer d=64 model on a CPU (configs/lowp.yaml), far too slow at GPT-2 size
#
# Duration: not measured (no GPU run of this script has been made). What it runs: throughput.py's four
#   GPT-2-small arms, then up to 7 arms x 1000 optimizer steps x 65,536 tokens (458M tokens in all), each arm
#   compiling its blocks and head first; each arm's seconds are in the JSON it writes, and the script prints
#   its total at the end.
# Before anything runs it also checks for a C compiler: Triton (train.compile's GPU backend) builds a small C
#   helper at the first compile and fails there, minutes in, without one (install gcc, or set CC).
#
# The Python used: $PYTHON, else .venv/bin/python when present, else python.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU and a CUDA build of torch" >&2
    exit 1
fi
if [ -n "${CC:-}" ] && ! command -v "$CC" >/dev/null 2>&1; then
    echo "gpu_check: CC=$CC is not a command; Triton would use it at the first torch.compile: install it, or unset CC" >&2
    exit 1
fi
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
    echo "gpu_check: no C compiler found (cc, gcc, clang); Triton needs one at the first torch.compile: install gcc (e.g. apt-get install build-essential) or set CC" >&2
    exit 1
fi
start=$(date +%s)
echo "gpu_check: started $(date); its duration on this GPU is not known in advance (see the header)"
"$PYTHON" benchmarks/throughput.py --gpt2-small
status=0
"$PYTHON" benchmarks/gpu_check.py "$@" || status=$?
echo "gpu_check: took $(( ($(date +%s) - start) / 60 )) min"
exit $status
