"""The V-cycle driver of multi-level training: one Trainer per stage, each in its own folder.

The V-cycle driver of multi-level training (Zou, Zhang & Deng, ICLR 2024, §3.4, Algorithm 1):
a list of stages, each trained by the one `accellib.core.trainer.Trainer` in its own folder.

    K = 2:   stage 0  large, warm_frac * S steps, LR warm-up, no decay        (ends at peak LR)
             coalesce (theta_0^saved = the large model now)
             stage 1  small, small_frac * S steps, LR x small_lr_mult, cosine decay
             de-coalesce, interpolate with theta_0^saved (alpha)
             stage 2  large, final_frac * S steps, cosine decay               (S = train.steps)
    K > 2:   the down leg repeats (warm, coalesce) per level, the up leg (de-coalesce, interpolate,
             train up_frac * S) per level, the last up stage is the final one.

    python -m accellib.train --config configs/multilevel_tiny.yaml --out runs/ml     (or --resume runs/ml)
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m accellib.train ...
(`accellib.train` hands any config with multilevel.enabled=true to `run_vcycle` below.)

Choices (Zou et al. §3.4 and the official code): a fresh AdamW per stage (the official code resets it too) with an optional
linear re-warm-up of `rewarm_steps`; each stage decays its LR with the trainer's warm-up + cosine schedule
(to optim.min_lr_ratio), where the official GPT-2 example runs every stage as a new HF Trainer with its
default *linear* decay to 0 (accellib's trainer has only the cosine schedule); the data stream
*continues*: stage k's step s draws the batch of global step offset_k + s, so the V-cycle reads the
same sequence of batches as the baseline (the official example restarts the sampler every stage).
Cumulative tokens / FLOPs / wall are carried into each stage's TrainState, so every stage's metrics
are on the whole run's axes; the mapping time is added to the wall clock.

Output folder:  config.yaml, vcycle.json (the stage plan + what is done), metrics.jsonl (all stages,
global steps, `stage` and `level` fields, plus a record of the loss right after each transition),
record.json, stage_k/ (a Trainer run: checkpoints/last, metrics.jsonl) and stage_k/final_model.pt
(the stage's trained weights: the next stage's input, and theta^saved for the up leg).
Resume: finished stages are skipped, the interrupted stage resumes from its checkpoint (exact),
a stage not yet begun is rebuilt from the saved weights of the stages before it.
"""
from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import yaml

from ..core.config import RunConfig, changed_options
from ..core.launch import distributed_setup, fsdp_requested, make_accelerator, process_state
from ..core.options import ConfigError
from ..core.records import read_metrics, write_json, write_record
from ..core.run_dir import checkpoint_folder, fall_back, main_decides, note_checkpoint, note_written, write_marker
from ..core.tasks import is_image_kind, make_task
from ..core.trainer import Trainer
from ..models.transformer import ModelConfig, num_params
from ..techniques import REGISTRY, build_techniques, check_fsdp
from ..techniques.multilevel import coalesce, decoalesce, interpolate, level_configs


@dataclass
class Stage:
    index: int
    level: int            # 0 = the target model
    kind: str             # "down" | "bottom" | "up"  (the last "up" is the final stage)
    steps: int
    lr_mult: float
    warmup: int           # linear LR warm-up steps of this stage
    decay: bool           # cosine decay to optim.min_lr_ratio over the stage (else constant)
    model: ModelConfig


def plan_stages(cfg: RunConfig) -> list[Stage]:
    """The V-cycle as a list of (model config, steps, LR multiplier, ...)."""
    ml = cfg.techniques["multilevel"]
    others = [n for n in cfg.enabled() if n != "multilevel"]
    if others:
        raise ConfigError(f"multilevel cannot be combined with {others[0]}: every V-cycle stage restarts the step "
                          f"counter, so {others[0]}'s schedule would restart with it; enable only one of them")
    if cfg.log.trackers:  # each stage's Trainer counts its own steps (one Accelerator is shared): not one tracked run
        raise ConfigError(f"log.trackers={','.join(cfg.log.trackers)} does not work with multilevel yet (every "
                          "V-cycle stage is its own Trainer, counting steps from 0); drop it: the run's "
                          "metrics.jsonl has every stage on global steps")
    K, S, m = ml.levels, cfg.train.steps, ml.level_map()
    cfgs = level_configs(cfg.model, K, m)   # raises MultiLevelError for a tied head / odd sizes
    steps = lambda frac: max(1, round(frac * S))
    stages: list[Stage] = []
    for k in range(K - 1):  # down leg: warm level k; the first stage has the run's LR warm-up
        w = min(cfg.optim.warmup_steps, steps(ml.warm_frac)) if k == 0 else ml.rewarm_steps
        stages.append(Stage(len(stages), k, "down", steps(ml.warm_frac), ml.small_lr_mult ** k, w, False, cfgs[k]))
    stages.append(Stage(len(stages), K - 1, "bottom", steps(ml.small_frac), ml.small_lr_mult ** (K - 1),
                        ml.rewarm_steps, True, cfgs[K - 1]))
    for k in range(K - 2, -1, -1):
        n = steps(ml.final_frac if k == 0 else ml.up_frac)
        stages.append(Stage(len(stages), k, "up", n, ml.small_lr_mult ** k, ml.rewarm_steps, True, cfgs[k]))
    return stages


def stage_flops(cfg: RunConfig, stages: list[Stage], world: int = 1) -> list[float]:
    """Analytic training FLOPs of each stage (all processes), as the Trainer counts them."""
    _need_vocab(cfg)
    t = cfg.train
    return [float(s.steps * world * t.grad_accum * make_task(stage_config(cfg, s)).micro_flops(None))
            for s in stages]


def baseline_flops(cfg: RunConfig, world: int = 1) -> float:
    _need_vocab(cfg)
    t = cfg.train
    return float(t.steps * world * t.grad_accum * make_task(cfg).micro_flops(None))


def _need_vocab(cfg: RunConfig) -> None:
    if cfg.model.vocab_size == 0 and not is_image_kind(cfg.model.kind):  # the head's FLOPs would be counted as 0
        raise ConfigError("model.vocab_size is 0: set it, or load the data first (run_vcycle fills it "
                          "from the data's meta.json)")


def stage_config(cfg: RunConfig, st: Stage) -> RunConfig:
    """The plain RunConfig one stage's Trainer runs: its model, steps, LR and warm-up."""
    c = copy.deepcopy(cfg)
    c.model = copy.deepcopy(st.model)
    if st.index > 0:
        c.model.init_from = ""       # a pretrained start (model.init_from) is stage 0's; later stages map weights
    c.train.steps = st.steps
    c.optim.lr = cfg.optim.lr * st.lr_mult
    c.optim.warmup_steps = st.warmup
    if not st.decay:
        c.optim.min_lr_ratio = 1.0   # WarmupCosine with min ratio 1 = warm-up then constant
    c.techniques["multilevel"].enabled = False
    return c


# ----------------------------------------------------------------------------- helpers
def _cpu_state(model: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.state_dict().items()}


def _stage_plan(stages: list[Stage]) -> list[dict]:
    return json.loads(json.dumps([dict(asdict(s), model=asdict(s.model)) for s in stages]))


def _start_or_resume(out: Path, stages: list[Stage], resume: bool) -> tuple[Optional[str], dict]:
    """(error, progress) as the main process sees the folder: a new run needs a folder without a
    V-cycle; a resumed one needs vcycle.json with the same stage plan (the plan is a function of
    train.steps and the multilevel section, so extending or re-planning a cycle is refused)."""
    p = out / "vcycle.json"
    if not resume:
        if p.exists():
            return f"{out} already holds a V-cycle run; continue it with --resume, or choose another --out", {}
        return None, {}
    if not p.exists():
        return f"{out} has no vcycle.json to resume; start a new run without --resume", {}
    progress = json.loads(p.read_text())
    if progress.get("stages") != _stage_plan(stages):
        old = sum(st["steps"] for st in progress.get("stages", []))
        return (f"the overrides change the stage plan of the V-cycle in {out} (planned for {old} steps in all, "
                f"now {sum(st.steps for st in stages)}); a V-cycle cannot be extended or re-planned on resume: "
                "drop the overrides, or start a new run with another --out"), {}
    return None, progress


def _global_offsets(stages: list[Stage]) -> list[int]:
    offs, n = [], 0
    for s in stages:
        offs.append(n)
        n += s.steps
    return offs


def write_combined_metrics(out: Path, stages: list[Stage], progress: dict) -> None:
    """out/metrics.jsonl: every stage's records on global steps, with stage/level fields, and the
    validation loss right after each transition (the jump) as its own record."""
    lines = []
    for st, off in zip(stages, _global_offsets(stages)):
        start = progress.get("start", {}).get(str(st.index))
        if start is not None:
            lines.append(dict(step=off, stage=st.index, level=st.level, transition=True, **start))
        d = out / f"stage_{st.index}"
        if (d / "metrics.jsonl").exists():
            for r in read_metrics(d):
                lines.append(dict(r, step=r["step"] + off, stage=st.index, level=st.level))
    tmp = out / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    os.replace(tmp, out / "metrics.jsonl")


def _stage_input(out: Path, stages: list[Stage], st: Stage, cache: dict, alpha: float, m) -> tuple[dict, float]:
    """The initial weights of stage `st` and the seconds spent mapping them."""
    def final_of(i: int) -> dict:
        if i not in cache:
            cache[i] = torch.load(out / f"stage_{i}" / "final_model.pt", map_location="cpu", weights_only=True)
        return cache[i]

    t0 = time.perf_counter()
    prev = stages[st.index - 1]
    if st.kind in ("down", "bottom"):                     # coalesce the stage above
        sd, small = coalesce(final_of(prev.index), prev.model, m)
        assert small == st.model
    else:                                                  # de-coalesce + interpolate with saved
        saved_i = max(s.index for s in stages if s.kind == "down" and s.level == st.level)
        sd = interpolate(final_of(saved_i), decoalesce(final_of(prev.index), st.model, m), alpha)
    return sd, time.perf_counter() - t0


# ----------------------------------------------------------------------------- the driver
def run_vcycle(cfg: RunConfig, out: str | Path, resume: bool = False, data=None) -> dict:
    """Train the whole V-cycle of `cfg` into `out` (works under `accelerate launch`, torchrun,
    `accellib.core.launch.launch_processes` and `notebook_launcher`); returns the final metrics (cumulative tokens,
    FLOPs and wall, global step) on every process."""
    ml = cfg.techniques["multilevel"]
    if not ml.enabled:
        raise ConfigError("run_vcycle needs multilevel.enabled=true (see configs/multilevel_tiny.yaml)")
    if fsdp_requested():  # before any process group forms
        check_fsdp([REGISTRY["multilevel"](ml, cfg)], cfg.model.kind)
    out, ps = Path(out), process_state(cfg.train.device)
    task = make_task(cfg, data, every_rank=True)
    task.configure()                                              # vocab_size (language), seq_len (ViT)
    data = task.data
    stages = plan_stages(cfg)
    m = ml.level_map()
    err, progress = main_decides(lambda: _start_or_resume(out, stages, resume))  # rank 0 reads, all obey
    if err:
        raise ConfigError(err)
    progress.setdefault("done", {})
    progress.setdefault("start", {})
    if ps.is_main_process:
        if not resume:
            print(describe(cfg, ps.num_processes))
        out.mkdir(parents=True, exist_ok=True)
        note_written(out, ["config.yaml", "vcycle.json", "metrics.jsonl", "metrics.jsonl.tmp", "record.json"],
                     runs=[f"stage_{st.index}" for st in stages])  # each stage a run folder with its own record
        if not resume:
            (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        else:  # the options this resume sets, which the next plain --resume keeps (accellib/train.py resume_config)
            write_marker(out, "run", resume=changed_options(out / "config.yaml", cfg))
        progress["stages"] = _stage_plan(stages)
        write_json(out / "vcycle.json", progress)
    ps.wait_for_everyone()

    cache: dict[int, dict] = {}
    carry = dict(tokens=0, flops=0.0, layer_tokens=0, wall=0.0)   # cumulative counters so far
    final: dict = {}
    offsets = _global_offsets(stages)
    acc = _one_accelerator(cfg, stages)
    for st, off in zip(stages, offsets):
        key, sdir = str(st.index), out / f"stage_{st.index}"
        if key in progress["done"]:                                 # finished before an interruption
            final = progress["done"][key]
            carry = {k: final[k] for k in carry}
            continue
        if (note := main_decides(lambda: fall_back(sdir) if sdir.is_dir() else None)) and ps.is_main_process:
            print(note, flush=True)                               # a damaged last: the newest intact kept one
        started = checkpoint_folder(sdir) is not None
        map_s = 0.0
        build = make_task(stage_config(cfg, st), data).build_model
        if st.index == 0:
            torch.manual_seed(cfg.train.seed)                      # the baseline's initialisation
            model = build()
        else:
            model = build()
            if not started:                                        # (a resumed stage loads its checkpoint)
                sd, map_s = _stage_input(out, stages, st, cache, ml.alpha, m)
                model.load_state_dict(sd, strict=True)
        # the data stream continues: stage step s reads the baseline's batches of global step off + s
        acc.free_memory()            # the previous stage's model, optimizer and loaders leave the Accelerator,
        acc._custom_objects.clear()  # and its checkpointed objects (state, techniques): save_state saves only this stage's
        tr = Trainer(stage_config(cfg, st), sdir, data=data, model=model, data_offset=off, accelerator=acc)
        if not started:
            for k, v in carry.items():                             # cumulative axes (checkpointed with the state)
                setattr(tr.state, k, v + (map_s if k == "wall" else 0))
            if st.index > 0:                                       # the loss right after the transition
                ev = tr.evaluate()
                progress["start"][key] = dict({k: round(v, 5) for k, v in ev.items()}, tokens=tr.state.tokens,
                                              flops=tr.state.flops, wall=round(tr.state.wall, 4))
                if ps.is_main_process:
                    write_json(out / "vcycle.json", progress)
        rec = tr.fit(resume=started)
        final = dict(rec, step=off + tr.state.step, stage=st.index, level=st.level)
        carry = {k: final[k] for k in carry}
        sd = _cpu_state(tr.raw_model)
        cache[st.index] = sd
        tr.accelerator.wait_for_everyone()
        if ps.is_main_process:                                     # weights first, then mark done
            note_checkpoint(sdir, sdir / "checkpoints" / "last")   # (Trainer.save records each one; once more here)
            note_written(sdir, ["final_model.pt", "final_model.pt.tmp"])
            tmp = sdir / "final_model.pt.tmp"
            torch.save(sd, tmp)
            os.replace(tmp, sdir / "final_model.pt")
            progress["done"][key] = final
            write_json(out / "vcycle.json", progress)
            write_combined_metrics(out, stages, progress)
        tr.accelerator.wait_for_everyone()
        # drop what this stage's weights are no longer needed for (inputs of later stages only)
        needed = {s.index for s in stages if s.kind == "down"} | {st.index}
        for i in [i for i in cache if i not in needed]:
            del cache[i]
        del tr, model
    if ps.is_main_process:
        write_combined_metrics(out, stages, progress)
        write_record(out, cfg.to_dict(), final, acc, params=num_params(make_task(cfg, data).build_model()),
                     distributed=distributed_setup(acc),
                     stage_flops=stage_flops(cfg, stages, ps.num_processes),
                     baseline_flops=baseline_flops(cfg, ps.num_processes))
    ps.wait_for_everyone()
    return final


def _one_accelerator(cfg: RunConfig, stages):
    """The one Accelerator of this process for every stage (Accelerate's model: one per process), with the
    DDP options any stage's techniques ask for."""
    ddp: dict = {}
    for st in stages:
        for tech in build_techniques(stage_config(cfg, st)):
            ddp.update(tech.ddp_kwargs())
    return make_accelerator(ddp, precision=cfg.train.precision, device=cfg.train.device)


def describe(cfg: RunConfig, world: int = 1) -> str:
    """A table of the stages with their analytic FLOPs (for the CLI and the notebook)."""
    stages = plan_stages(cfg)
    fl, base = stage_flops(cfg, stages, world), baseline_flops(cfg, world)
    lines = [f"{'stage':<6}{'kind':<8}{'level':>6}{'L':>4}{'d':>6}{'H':>4}{'steps':>7}{'lr x':>7}{'FLOPs':>11}{'/base':>7}"]
    for s, f in zip(stages, fl):
        lines.append(f"{s.index:<6}{s.kind:<8}{s.level:>6}{s.model.n_layer:>4}{s.model.d_model:>6}{s.model.n_head:>4}"
                     f"{s.steps:>7}{s.lr_mult:>7.2f}{f:>11.3e}{f / base:>7.3f}")
    lines.append(f"{'total':<43}{sum(fl):>11.3e}{sum(fl) / base:>7.3f}")
    return "\n".join(lines)
