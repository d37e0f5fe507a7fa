"""The trainer against a plain PyTorch loop (benchmarks/throughput.py's), each loop in its own process (no dynamo
cache entry, allocator state or warm kernel shared between them), and the host-time probe: the same loops at
batch 1 x 64 tokens, where the device does almost nothing and a step's time is the host's work.

    plain               the loop a careful user writes by hand (throughput.plain_loop)
    accellib            Trainer.train_step, train.compile=none
    plain+compile       the plain loop with every block (and the head + loss) torch.compiled
    accellib+compile    the trainer with train.compile=blocks (the shipped config)
    accellib+model      the trainer with train.compile=model (the whole model), when this checkout has it

Each process warms its loop up (compilation happens there), then times `reps` blocks of `block` steps, each
block between two CUDA events (perf_counter on a CPU) with one host read of the loss per block, as a logging
trainer does. A ratio is tokens/s of one loop over another: the plain loop's median seconds per step over the
trainer's."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from .base import ROOT, Deadline, rel
from .check import CONFIG, base_overrides

LOOPS = ("plain", "accellib", "plain+compile", "accellib+compile", "accellib+model")
RATIOS = (("accellib", "plain"), ("accellib+compile", "plain+compile"), ("accellib+model", "plain+compile"),
          ("accellib+compile", "accellib"))


def _loop(name: str, cfg, backend: str):
    """(run(n), the trainer that resolved the config, FLOPs per step) of one loop."""
    import copy

    from throughput import plain_loop, trainer_loop

    from accellib.core.trainer import Trainer
    ecfg = copy.deepcopy(cfg)
    ecfg.train.compile = {"accellib+compile": "blocks", "accellib+model": "model"}.get(name, "none")
    tr = Trainer(ecfg)
    flops = tr.task.micro_flops(None) * ecfg.train.grad_accum
    if name.startswith("plain"):
        run = plain_loop(ecfg, tr.data, tr.accelerator.device, backend if name == "plain+compile" else None)
        device = tr.accelerator.device
        tr.accelerator.free_memory()
        return run, device, flops
    return trainer_loop(tr), tr.accelerator.device, flops


def time_loop(name: str, cfg, backend: str, warmup: int, reps: int, block: int) -> dict:
    import torch

    from .timing import StepTimer, graphs
    run, device, flops = _loop(name, cfg, backend)
    run(warmup)
    if device.type == "cuda":
        torch.cuda.synchronize()
    g0, timer = graphs(), StepTimer(device)
    cpu0 = time.process_time()
    timer.mark()
    for _ in range(reps):
        run(block)
        timer.mark()
    secs = timer.seconds()
    cpu = time.process_time() - cpu0
    return dict(block_s=[round(s, 6) for s in secs], step_s=statistics.median(secs) / block,
                host_cpu_per_step_s=cpu / (reps * block), flops_per_step=flops,
                tokens_per_step=cfg.train.batch_size * cfg.model.seq_len, graphs_timed=graphs() - g0)


def loop_worker(job: dict) -> int:
    """One loop in this process: the main shape, then the host-time probe; the result as JSON in job["out"]."""
    import torch

    from accellib.core.config import load_config
    from accellib.core.records import write_json
    if job["smoke"]:
        torch.set_num_threads(1)
    out = {}
    for label, over, reps, block in (("main", job["overrides"], job["reps"], job["block"]),
                                     ("host", job["host_overrides"], 1, job["host_steps"])):
        torch._dynamo.reset()
        cfg = load_config(ROOT / CONFIG, over)
        out[label] = time_loop(job["loop"], cfg, job["backend"], job["warmup"], reps, block)
    write_json(job["out"], out)
    return 0


def part_trainer_vs_plain(c) -> dict:
    sc = c.sc
    compiled = ((c.rec.get("environment") or {}).get("compile_probe") or {}).get("ok", False)
    names = [n for n in LOOPS if compiled or "compile" not in n and "model" not in n]
    left_out = {}
    if "accellib+model" in names and not c.features.get("compile_model"):
        names.remove("accellib+model")
        left_out["accellib+model"] = "train.compile=model is not in this checkout's TrainConfig yet"
    if not compiled:
        left_out["compiled loops"] = "the compile probe failed (environment.compile_probe)"
    steps = sc["loop_warmup"] + sc["reps"] * sc["block"] + sc["host_steps"] + 2
    over = base_overrides(c.args, rel(c.data()), steps)
    host = over + [f"--train.batch_size={sc['host_batch']}", f"--model.seq_len={sc['host_seq']}"]
    res = {}
    for name in names:
        path = c.runs / f"loop_{name.replace('+', '_')}.json"
        path.unlink(missing_ok=True)
        job = dict(loop=name, smoke=c.args.smoke, overrides=over, host_overrides=host, warmup=sc["loop_warmup"],
                   reps=sc["reps"], block=sc["block"], host_steps=sc["host_steps"], backend=c.backend, out=str(path))
        cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--loop-worker", json.dumps(job)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                               timeout=max(1.0, c.clock.left() + c.clock.margin / 4))
        except subprocess.TimeoutExpired:
            raise Deadline() from None
        if p.returncode != 0 or not path.is_file():
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
            res[name] = dict(status="failed", error=f"the {name} process exited with status {p.returncode}: {tail}")
            continue
        res[name] = json.loads(path.read_text())
    ok = {k: v for k, v in res.items() if "main" in v}
    if not ok:
        raise RuntimeError("no loop ran: " + "; ".join(f"{k}: {v.get('error')}" for k, v in res.items()))
    ratios, host = {}, {}
    for a, b in RATIOS:
        if a in ok and b in ok:
            ratios[f"{a} / {b}"] = round(ok[b]["main"]["step_s"] / ok[a]["main"]["step_s"], 4)
            host[f"{a} / {b}"] = round(ok[b]["host"]["step_s"] / ok[a]["host"]["step_s"], 4)
    mfu = {k: c.mfu(v["main"]["flops_per_step"], v["main"]["step_s"]) for k, v in ok.items()}
    return dict(loops=res, ratios=ratios, mfu=mfu, left_out=left_out,
                host_probe=dict(batch=sc["host_batch"], seq_len=sc["host_seq"], ratios=host,
                                step_s={k: v["host"]["step_s"] for k, v in ok.items()},
                                host_cpu_per_step_s={k: v["host"]["host_cpu_per_step_s"] for k, v in ok.items()},
                                what="the same loops at batch 1 x a short sequence: the device does almost nothing, "
                                     "so seconds per step are the host's overhead per step"),
                method="each loop in its own process, one after the other: warm-up, then blocks of steps between "
                       "CUDA events (perf_counter on a CPU); tokens/s ratios from the median seconds per step")

