"""The card's measured matmul peak, and a windowed profile of the compiled baseline: torch.profiler with
schedule(wait, warmup, active) records only the active steps, each of which is also between two CUDA events, so
the busy share is the kernels' device time over the CUDA-event time of the same steps (not over the profiler's own
wall, which holds its start, stop and parse)."""
from __future__ import annotations

from .timing import StepTimer, graphs


def part_matmul_peak(c) -> dict:
    from accellib.core.hardware import measure_matmul_flops
    torch = c.torch
    dtype = torch.float32 if c.args.smoke else torch.bfloat16
    m = measure_matmul_flops(c.device, dtype, c.sc["peak_n"], c.sc["peak_s"])
    c.peak_measured = m["best"]
    sheet = c.peaks()["datasheet"]
    return dict(m, datasheet=sheet, best_over_datasheet=round(m["best"] / sheet, 4) if sheet else None)


def part_profile(c) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule

    from accellib.core.trainer import Trainer
    torch = c.torch
    wait, warm_p, active = c.sc["profile"]
    n = wait + warm_p + active
    c.reset_compiler()
    tr = Trainer(c.config([], steps=c.sc["warmup"] + n + 2))
    for _ in range(c.sc["warmup"]):
        loss = tr.train_step()
    c.sync()
    float(loss)
    cuda = c.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    timer = StepTimer(c.device)
    g0 = graphs()
    with profile(activities=acts, schedule=schedule(wait=wait, warmup=warm_p, active=active, repeat=1)) as prof:
        for i in range(n):
            if i == wait + warm_p:
                timer.mark()
            loss = tr.train_step()
            if i >= wait + warm_p:
                timer.mark()
            prof.step()
    c.sync()
    float(loss)
    step_s = timer.seconds()
    event_s = sum(step_s)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    # on a GPU the device's own events (kernels, copies): the CPU-side operators that launch them are left out
    ev = [e for e in prof.key_averages() if getattr(e, key, 0) > 0
          and (not cuda or e.device_type != torch.autograd.DeviceType.CPU)]
    ev.sort(key=lambda e: getattr(e, key), reverse=True)
    busy = sum(getattr(e, key) for e in ev) / 1e6
    top = [dict(name=e.key[:120], seconds=round(getattr(e, key) / 1e6, 5),
                share_of_steps=round(getattr(e, key) / 1e6 / event_s, 4) if event_s else None, calls=e.count)
           for e in ev[:15]]
    tr.accelerator.free_memory()
    del tr, prof
    out = dict(schedule=dict(wait=wait, warmup=warm_p, active=active), active_step_s=[round(s, 6) for s in step_s],
               event_s=round(event_s, 5), kernel_s=round(busy, 5), graphs_during_profile=graphs() - g0,
               busy_share=round(busy / event_s, 4) if cuda and event_s else None, top=top,
               note=("busy_share = the kernels' self device time in the active steps / the CUDA-event time of the "
                     "same steps" if cuda else "CPU: operators' self CPU time (no device timeline); busy_share is "
                                               "not applicable on CPU"))
    c.reset_compiler()
    return out
