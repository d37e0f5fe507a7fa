"""The technique notebooks' GPU cell: a technique and its baseline timed on one GPU, or a pointer to the GPU record.

Each technique notebook has one GPU cell, apart from its cache-checked CPU runs. With CUDA it builds one trainer per
arm on a small GPU config, runs a few warm-up steps (compilation and allocator growth happen there; timed apart, on
the host after a synchronize), then times `steps` steps, each between two CUDA events (perf_counter on a CPU, where
a step is synchronous), and prints tokens/s of every arm and its speed against its base arm. It measures the way
the GPU record does (benchmarks/gpu/points.py, benchmarks/gpu/timing.py, which import `StepTimer`, `graphs` and
`realized` from here): every arm at a fixed point of its schedule, in steady state. Where an arm saves FLOPs
against its base, the realized speed-up is (1 - t/t_base) / (1 - F/F_base), t the mean seconds per step and F the
trainer's analytic FLOPs per step; where it does not, the plain time ratio t_base / t.

Without CUDA the cell times nothing: `skip` prints what it would show and what the committed GPU record
(results/gpu_check_h200.json, results/notebooks_nvidia_h200.json) holds for the technique, read from the files: its
point's tokens/s against the baseline's, and where the record stores them the realized speed-up with the time and
FLOPs savings it divides (a negative one reads as a slower step despite fewer FLOPs), or the FLOPs it added; for
the V-cycle its half-size level against its full-size one and the predicted whole run's realized speed-up.

    from accellib.course import gpu_cell
    gpu_cell.run("PLD at theta = 0.5", "configs/tutorial.yaml",
                 {"baseline": [], "pld@0.5": ["--pld.enabled=true", "--pld.theta_bar=0.5", "--pld.gamma=1000"]},
                 record="pld")
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Optional

GPU_SCALE = ["--model.n_layer=6", "--model.d_model=384", "--model.n_head=6", "--model.seq_len=256",
             "--train.batch_size=32"]    # on top of configs/tutorial.yaml: a small GPU config, 10.8 M parameters
RECORD = "results/gpu_check_h200.json"
NOTEBOOKS_RECORD = "results/notebooks_nvidia_h200.json"


def graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


class StepTimer:
    """Marks around steps: CUDA events on a GPU (read once, after one synchronize at the end), perf_counter on a
    CPU. `seconds()` gives each interval."""

    def __init__(self, device):
        import torch
        self.torch, self.cuda, self.marks = torch, device.type == "cuda", []

    def mark(self) -> None:
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def realized(p: dict, base: dict) -> dict | None:
    """Time saving over FLOPs saving per step against the base, and the plain speed-up (mean seconds per step)."""
    if not (p.get("mean_step_s") and base.get("mean_step_s") and p.get("flops_per_step") and base.get("flops_per_step")):
        return None
    f_saving = 1 - p["flops_per_step"] / base["flops_per_step"]
    t_saving = 1 - p["mean_step_s"] / base["mean_step_s"]
    return dict(speedup=round(base["mean_step_s"] / p["mean_step_s"], 4), flops_saving=round(f_saving, 4),
                time_saving=round(t_saving, 4), realized=round(t_saving / f_saving, 4) if f_saving > 1e-6 else None)


def cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def fp8_ready() -> bool:
    """A GPU with FP8 tensor cores (compute capability 8.9 or later) and torchao importable."""
    import importlib.util

    import torch
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
            and importlib.util.find_spec("torchao") is not None)


def _repo(path: str | Path) -> Path:
    """A path as given when it exists from here, else inside the checkout (a notebook runs in notebooks/)."""
    from .. import REPO_ROOT
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def _config(path: Path, overrides: list[str]):
    """A config file with the overrides; a comparison's file (with an `arms:` section) gives its base config."""
    from ..core.config import load_config, read_yaml
    raw = dict(read_yaml(path) or {})
    raw.pop("arms", None)
    return load_config(None, overrides, extra=raw)


def time_steps(tr, device, warmup: int, steps: int) -> dict:
    """`warmup` steps (wall timed on the host after a synchronize), then `steps` steps each between two marks."""
    import torch
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g0, t0, loss = graphs(), time.perf_counter(), None
    for _ in range(warmup):
        loss = tr.train_step()
    sync()
    if loss is not None:
        float(loss)
    warm_s, g1 = time.perf_counter() - t0, graphs()
    st = tr.state
    tok0, fl0 = st.tokens, st.flops
    timer = StepTimer(device)
    timer.mark()
    for _ in range(steps):
        loss = tr.train_step()
        timer.mark()
    secs = timer.seconds()
    total = sum(secs)
    return dict(warmup_steps=warmup, warmup_s=round(warm_s, 3), timed_steps=len(secs), step_s=[round(s, 6) for s in secs],
                mean_step_s=total / len(secs), median_step_s=statistics.median(secs),
                tokens_per_step=(st.tokens - tok0) / len(secs), flops_per_step=(st.flops - fl0) / len(secs),
                tok_per_s=round((st.tokens - tok0) / total, 1), final_loss=round(float(loss), 4),
                graphs=dict(warmup=g1 - g0, timed=graphs() - g1))


def gpu_speed(config: str | Path, arms: dict[str, list[str]], *, base: str | dict | None = None, warmup: int = 5,
              steps: int = 20, device: Optional[str] = None, scale: Optional[list[str]] = None,
              overrides: tuple | list = ()) -> dict:
    """Time every arm of `arms` ({name: its overrides}) on `config` + `scale` (GPU_SCALE by default) + `overrides`:
    one trainer per arm, `warmup` steps timed apart, then `steps` timed steps. `base`: the arm every other is
    compared with (default the first), or {arm: its base}. `device`: "cuda" (the default when present) or "cpu"
    (what the tests force). Returns {device, config, scale, timer, arms: {name: timing}, vs: {name: realized}}."""
    import torch

    from ..core.hardware import peak_memory_gb
    from ..core.trainer import Trainer
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = list(arms)
    bases = base if isinstance(base, dict) else {n: base or names[0] for n in names}
    path, scale = _repo(config), GPU_SCALE if scale is None else list(scale)
    data = Path(_config(path, []).data.path)
    fixed = [*scale, *overrides, f"--train.device={dev.type}", "--train.progress=false", "--train.log_every=100000",
             "--train.eval_every=0", "--train.checkpoint_every=0", f"--train.steps={warmup + steps + 2}"]
    if not data.is_absolute() and not data.exists():
        fixed.append(f"--data.path={_repo(data)}")
    out = dict(device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", config=str(config), scale=scale,
               timer="CUDA events around each step" if dev.type == "cuda" else "perf_counter around each step (CPU)",
               arms={}, vs={})
    for name in names:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        tr = Trainer(_config(path, fixed + list(arms[name])))
        r = time_steps(tr, dev, warmup, steps)
        r.update(overrides=list(arms[name]), precision=tr.precision, peak_mem_gb=round(peak_memory_gb(dev), 3))
        lowp = next((t for t in tr.techniques if getattr(t, "fp8", None)), None)
        if lowp is not None:     # backend=torchao: how many Linears converted, and why
            r["fp8"] = dict(lowp.fp8)
        out["arms"][name] = r
        del tr
    for name in names:
        b = bases.get(name)
        if b and b != name:
            out["vs"][name] = dict(base=b, **(realized(out["arms"][name], out["arms"][b]) or {}))
    return out


def show(res: dict) -> None:
    """Print a gpu_speed result: where and how it was timed, then one line per arm."""
    first = next(iter(res["arms"].values()))
    print(f"{res['device']}: {res['config']}" + (f" {' '.join(res['scale'])}" if res["scale"] else "")
          + f"; {first['warmup_steps']} warm-up steps timed apart, then {first['timed_steps']} steps timed ({res['timer']})")
    width = max(len(n) for n in res["arms"])
    for name, r in res["arms"].items():
        line = (f"  {name:<{width}}  {r['tok_per_s']:>12,.0f} tok/s  {1e3 * r['mean_step_s']:8.2f} ms/step  "
                f"peak {r['peak_mem_gb']:.2f} GB  ({r['precision']})")
        v = res["vs"].get(name)
        if v and v.get("speedup"):
            v = dict(v, speedup=float(f"{v['speedup']:.3g}"))
            if v.get("realized") is not None:
                line += (f"  {v['speedup']:g}x {v['base']}'s speed; realized speed-up {v['realized']:.2f} "
                         f"(time saving {v['time_saving']:+.1%} / FLOPs saving {v['flops_saving']:+.1%})")
            else:
                line += f"  {v['speedup']:g}x {v['base']}'s speed (same FLOPs per step: the time ratio)"
        if r.get("fp8"):
            line += f"  FP8 Linears {r['fp8'].get('fp8_layers')}"
        print(line)


def _tps(p: dict) -> float | None:
    return p.get("tok_per_s") or (p["tokens_per_step"] / p["mean_step_s"] if p.get("mean_step_s") else None)


def recorded(technique: str, root: Optional[Path] = None) -> dict | None:
    """What the committed GPU record holds for `technique`: a point of the reworked check's record (issue 42: its
    own point, else the one the findings tables stand it for, `analysis.results.GPU_POINTS`; the V-cycle's half-size
    level against its full-size one, with the predicted whole run's realized speed-up), or an arm of the old check's
    (issue 34): its tokens/s, its base's, their ratio and the realized speed-up where one was stored."""
    from .. import REPO_ROOT
    from ..analysis.results import GPU_POINTS
    rec = json.loads(((root or REPO_ROOT) / RECORD).read_text())
    arms, parts = rec.get("arms") or {}, rec.get("parts") or {}
    key = technique if f"point:{technique}" in parts else GPU_POINTS.get(technique)
    got, base = arms.get(technique) or parts.get(f"point:{key}"), arms.get("baseline") or parts.get("point:baseline")
    name, base_name, vs = technique if technique in arms else key or technique, "the baseline's", None
    levels = (parts.get("vcycle") or {}).get("levels") or {}
    if technique == "multilevel" and not got and (parts.get("vcycle") or {}).get("status") == "done" and len(levels) > 1:
        (_, base), (_, got) = sorted(levels.items(), key=lambda kv: int(kv[0]))[:2]
        shape = lambda lv: f"({lv['model']['n_layer']} x {lv['model']['d_model']})"    # noqa: E731
        name, base_name = f"the V-cycle's half-size level {shape(got)}", f"the full-size level's {shape(base)}"
        got = dict(got, status="done")
        vs = dict(((parts.get("predict") or {}).get("configs") or {}).get("multilevel") or {}, whole_run=True)
    if not got or got.get("status") != "done" or not base:
        return None
    tps, btps = _tps(got), _tps(base)
    vs = vs or got.get("realized_speedup") or got.get("vs_baseline") or {}
    stages = [v.get("tok_per_s") for _, v in sorted((got.get("stages") or {}).items(), key=lambda kv: int(kv[0]))]
    return dict(device=rec.get("device"), config=rec.get("config"), name=name, base_name=base_name, tok_per_s=tps,
                base_tok_per_s=btps, speed=tps / btps if tps and btps else None, realized=vs.get("realized"),
                flops_saving=vs.get("flops_saving"), time_saving=vs.get("time_saving"),
                whole_run=vs.get("config") if vs.get("whole_run") else None,
                fp8_layers=(got.get("fp8") or {}).get("fp8_layers"),
                stages=stages if stages and all(stages) else None)


def notebook_record(notebook: str, root: Optional[Path] = None) -> dict | None:
    """This notebook's entry in results/notebooks_nvidia_h200.json (status, seconds, GPU memory), or None."""
    from .. import REPO_ROOT
    rec = json.loads(((root or REPO_ROOT) / NOTEBOOKS_RECORD).read_text())
    nb = next((v for k, v in (rec.get("notebooks") or {}).items() if k.startswith(notebook)), None)
    return dict(nb, gpu=rec.get("gpu")) if nb else None


def skip(what: str, technique: Optional[str], notebook: str, root: Optional[Path] = None) -> str:
    """The two lines a GPU cell prints without CUDA: what it would time, and what the committed record holds."""
    lines = [f"No CUDA device here, so this cell times nothing; on a GPU it times {what} and prints tokens/s of "
             f"each and the speed-up."]
    r = recorded(technique, root) if technique else None
    if r and r["speed"]:
        real = ""
        if r.get("realized") is not None:      # with the two savings it divides, so that a sign reads
            real = (f"; the predicted whole run ({r['whole_run']})" if r.get("whole_run") else ",") + (
                f" realized speed-up {r['realized']:.2f}") + (
                f" (time saving {r['time_saving']:+.1%} / FLOPs saving {r['flops_saving']:+.1%})"
                if r.get("time_saving") is not None and r.get("flops_saving") is not None else "")
        elif r.get("flops_saving") and abs(r["flops_saving"]) > 1e-6:   # more FLOPs than the baseline: no ratio
            real = f", with {-r['flops_saving']:+.1%} FLOPs per step against the baseline's (no saving to realize)"
        if r.get("stages"):
            real += f"; per stage {' / '.join(f'{v:,.0f}' for v in r['stages'])} tok/s"
        if r.get("fp8_layers") and str(r["fp8_layers"]).split("/")[0] in ("", "0"):   # bf16 timed against bf16
            real += f"; FP8 Linears {r['fp8_layers']}: none converted, so FP8 itself was not timed"
        lines.append(f"The committed GPU record ({RECORD}, {r['device']}, {r['config']}): {r['name']} "
                     f"{r['tok_per_s']:,.0f} tok/s against {r['base_name']} {r['base_tok_per_s']:,.0f}, "
                     f"{r['speed']:.2f}x its speed{real}.")
    else:
        nb = notebook_record(notebook, root)
        ran = (f"; {NOTEBOOKS_RECORD} ran this notebook on the {nb['gpu']} ({nb['status']}, {nb['seconds']:.0f} s, "
               f"at most {nb['cuda_max_allocated_mb']:,.0f} MB of GPU memory allocated)") if nb else ""
        lines.append(f"The committed GPU record ({RECORD}) has no {technique or 'such'} point{ran}.")
    text = "\n".join(lines)
    print(text)
    return text


def run(what: str, config: str | Path, arms: dict[str, list[str]], *, record: Optional[str], notebook: str,
        **kw) -> dict | None:
    """The GPU cell in one call: with CUDA gpu_speed(config, arms, **kw) and show it; without, skip(...)."""
    if not cuda():
        skip(what, record, notebook)
        return None
    res = gpu_speed(config, arms, **kw)
    show(res)
    return res
