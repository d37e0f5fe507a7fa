"""Per-step times of a trainer in steady state: CUDA events around every step on a GPU (perf_counter on a CPU,
where a step is synchronous), warm-up steps (where compilation happens) timed apart, graphs compiled counted
with dynamo's counters in the warm-up and in the timed steps, and synchronizing calls counted with
torch.cuda.set_sync_debug_mode("warn") over a few further steps."""
from __future__ import annotations

import statistics
import time
import warnings

from accellib.course.gpu_cell import StepTimer, graphs  # noqa: F401  (shared with the notebooks' GPU cell)


# what torch warns once per process when the debug mode is first set: a notice about the mode, not a synchronizing
# call (the 2026-11-28 H200 record counted it as one, 0.333 per step on the first point counted)
TORCH_NOTICE = "Synchronization debug mode is a prototype feature"


def count_syncs(c, step, n: int) -> dict:
    """Synchronizing CUDA calls over `n` calls of step(): torch.cuda.set_sync_debug_mode("warn") makes every one a
    warning, counted here. On a CPU nothing synchronizes with a device: not applicable."""
    if c.device.type != "cuda" or n <= 0:
        return dict(per_step=None, steps=0, note="not applicable on CPU (no device to synchronize with)")
    torch = c.torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(n):
                step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    msgs = [str(w.message) for w in caught
            if "synchroniz" in str(w.message).lower() and TORCH_NOTICE not in str(w.message)]
    c.sync()
    return dict(per_step=round(len(msgs) / n, 3), steps=n, first=sorted(set(m.splitlines()[0][:160] for m in msgs))[:5])


def time_trainer(c, tr, warmup: int, steps: int, sync_steps: int = 0) -> dict:
    """`warmup` steps (compilation happens there; wall timed on the host after a synchronize), then `steps` steps
    each between two marks, then `sync_steps` steps under the sync counter. Stops early (and says so) when the
    deadline's margin is reached. Seconds per step: every timed step's, their mean (what a run pays on average:
    the integration uses it) and median."""
    from accellib.core.hardware import peak_memory_gb
    g0 = graphs()
    t0 = time.perf_counter()
    loss = None
    for _ in range(warmup):
        loss = tr.train_step()
    c.sync()
    if loss is not None:
        float(loss)
    warm_s = time.perf_counter() - t0
    st = tr.state
    tok0, fl0, g1 = st.tokens, st.flops, graphs()
    timer, done, cut = StepTimer(c.device), 0, False
    timer.mark()
    for _ in range(steps):
        if c.clock.left() <= 0:
            cut = True
            break
        loss = tr.train_step()
        timer.mark()
        done += 1
    secs = timer.seconds()
    last = float(loss) if loss is not None else float("nan")
    g2 = graphs()
    tokens, flops = st.tokens - tok0, st.flops - fl0
    total = sum(secs)
    mean = total / done if done else None
    out = dict(warmup_steps=warmup, warmup_s=round(warm_s, 3), timed_steps=done, planned_steps=steps,
               cut_by_deadline=cut, step_s=[round(s, 6) for s in secs], mean_step_s=mean,
               median_step_s=statistics.median(secs) if secs else None,
               tokens_per_step=tokens / done if done else None, flops_per_step=flops / done if done else None,
               tok_per_s=round(tokens / total, 1) if total > 0 else None,
               mfu=c.mfu(flops, total) if total > 0 else None,
               compile_s=round(max(0.0, warm_s - warmup * mean), 3) if mean else None,
               graphs=dict(warmup=g1 - g0, timed=g2 - g1), final_train_loss=round(last, 4),
               timer="CUDA events around each step" if c.device.type == "cuda" else "perf_counter around each step (CPU)")
    if sync_steps and not cut:
        out["sync_calls"] = count_syncs(c, tr.train_step, sync_steps)
    elif sync_steps:
        out["sync_calls"] = dict(per_step=None, steps=0, note="not counted: the deadline cut the timed steps")
    out["peak_mem_gb"] = round(peak_memory_gb(c.device), 3)
    return out
