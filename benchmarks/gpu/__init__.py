"""The parts of benchmarks/gpu_check.py (issue 42), one module each:

    base      the record, the clock and the deadline, running a part, the plan
    env       the preflight (one-line refusals), the environment part, torchao from .whl/
    check     the check's sizes, configs, data and shared state (Check)
    timing    per-step times (CUDA events on a GPU, perf_counter on a CPU), graphs compiled in warm-up vs timed steps
    points    each technique at fixed schedule points in steady state, one-off work timed apart
    predict   whole-run time of each full-scale config from the points, and the check against a short real run
    loops     the trainer against a plain loop, each loop in its own process, and the host-time probe
    profile   the matmul peak, the windowed profile (kernel time over event time), synchronizing calls per step
    targets   the targets in one table, the verdicts, the summary and the findings table's GPU cells
"""
