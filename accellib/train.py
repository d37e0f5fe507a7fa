"""Command line: train one configuration.

    python -m accellib.train --config configs/tiny.yaml --out runs/tiny [--section.key=value ...]
    python -m accellib.train --config configs/tutorial.yaml --arm pld --out runs/pld   (one arm of a compare YAML)
    python -m accellib.train --resume runs/tiny [--train.steps=600]
    python -m accellib.train --config configs/tiny.yaml --out runs/tiny --overwrite   (replace a run)
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m accellib.train ...
    torchrun --nproc_per_node 2 -m accellib.train ...
    python -m accellib.train --help          (every option with its default)

Writes to --out: config.yaml, metrics.jsonl, checkpoints/last/, record.json, loss.png, and .accellib.json (with
its copy .accellib.copy.json), the record of every path it wrote there: --overwrite deletes those and nothing else.
    python -m accellib.train --adopt RUN_DIR   (a run written before accellib kept that record: all of it becomes accellib's)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import prog
from .core.options import ConfigError
from .core.config import RunConfig, changed_options, help_text, load_config, read_yaml
from .data.tokens import DataError
from .core.launch import LaunchError, fsdp_requested, process_state, tell_elastic_launcher
from .core.run_dir import (adopt_run, check_out, clear_run, fall_back, holds_run, lock_run, main_decides, note_checkpoint,
                            note_new, note_written, snapshot, unlock_run, write_marker)
from .models.transformer import num_params
from .core.trainer import Trainer, TrainingError

USER_ERRORS = (ConfigError, DataError, LaunchError, TrainingError)


def training_function(cfg: RunConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
                      arm: str | None = None) -> dict:
    """Train `cfg` into `out` (the same function serves the CLI, `accelerate launch` and
    `notebook_launcher`); returns the final metrics on every process. Everything that can refuse
    the run (launch, config, data, techniques, the V-cycle's stage plan, the run folder) is checked
    before `overwrite` deletes anything. `arm`: the run is this arm of the comparison that calls it."""
    from .analysis.plotting import plot_val_curves, save_fig, set_style
    from .core.records import read_metrics, write_record

    out = Path(out)
    if fsdp_requested():  # what cannot run under FSDP says so before any process group forms (one line)
        from .techniques import build_techniques, check_fsdp
        check_fsdp(build_techniques(cfg), cfg.model.kind)
    process_state(cfg.train.device)  # launch and device errors first: they say how to start the run
    from .core.tasks import make_task
    task = make_task(cfg, every_rank=True)  # every process, after process_state: one hashes the tokens
    data = task.data
    ml = cfg.techniques.get("multilevel")
    vcycle = ml is not None and ml.enabled
    if vcycle:  # the V-cycle drives one trainer per stage itself; planning it validates it
        from .techniques import REGISTRY, check_applicable
        from .drivers.vcycle import plan_stages, run_vcycle
        check_applicable([REGISTRY[n] for n in cfg.enabled()], cfg.model.kind)  # (a Trainer checks the others)
        task.configure()
        plan_stages(cfg)
    else:
        trainer = Trainer(cfg, out, data=data)  # builds the techniques: writes nothing yet

    def decide():  # on the main process: take the folder first, so no other command can change it meanwhile
        if err := lock_run(out):
            return err, None
        try:
            check_out(out, resume, overwrite, arm)
            if overwrite and holds_run(out):
                clear_run(out)
        except ConfigError as e:
            unlock_run(out)
            return str(e), None
        write_marker(out, "run", **(dict(arm=arm) if arm else {}))  # the folder is accellib's run
        return None, fall_back(out) if resume else None  # a damaged checkpoints/last: the newest intact kept one
    err, note = main_decides(decide)
    if err:
        raise ConfigError(err)
    is_main = process_state(cfg.train.device).is_main_process
    if is_main and note:
        print(note, flush=True)
    tracked = snapshot(out, "tensorboard") if is_main else set()  # what the TensorBoard tracker adds is accellib's
    try:
        if vcycle:
            return run_vcycle(cfg, out, resume=resume, data=data)
        final = trainer.fit(resume=resume)
        if trainer.is_main:
            resumes = dict(resumes=trainer.state.resumes) if trainer.state.resumes else {}  # what each resume changed
            if trainer.state.one_off:  # seconds of one-off work timed apart from training (Trainer.one_off)
                resumes["one_off_s"] = {k: round(v, 4) for k, v in trainer.state.one_off.items()}
            if trainer.state.rewinds:  # what the divergence guard did (Trainer._rewind)
                resumes["rewinds"] = trainer.state.rewinds
            note_written(out, ["record.json", "loss.png"])
            write_record(out, cfg.to_dict(), final, trainer.accelerator, params=num_params(trainer.raw_model),
                         distributed=trainer.distributed(), **resumes)
            set_style()
            save_fig(plot_val_curves({out.name: read_metrics(out)}, xs=("step", "flops", "wall")), out / "loss.png")
        trainer.accelerator.wait_for_everyone()
        return final
    finally:
        if is_main:
            if not vcycle:  # (Trainer.save records each checkpoint it writes; the last one also here, once)
                note_checkpoint(out, out / "checkpoints" / "last")
            note_new(out, "tensorboard", tracked)
            unlock_run(out)


def kept_options(run_dir: Path) -> dict:
    """The options the run's last resume set ({"optim.lr": 0.001}): from its record (the marker, or its copy when the
    marker is damaged), or, for a run resumed before the record kept them, from the last entry of `resumes` in its
    checkpoint's training state."""
    from .core.run_dir import checkpoint_folder, checkpoint_state, read_marker
    mark = read_marker(run_dir)
    if isinstance(mark.get("resume"), dict):
        return mark["resume"]
    src = checkpoint_folder(run_dir)
    resumes = checkpoint_state(src).get("resumes") if src is not None else None
    try:
        return {k: v[1] for k, v in resumes[-1]["changes"].items()} if resumes else {}
    except (KeyError, TypeError, IndexError):  # not the shape accellib writes: nothing kept
        return {}


def resume_config(run_dir: Path, overrides: list[str]) -> tuple[RunConfig, str]:
    """The run's effective config (config.yaml with the options its last resume set) plus overrides that a resume
    may change, and a line saying what the resume uses. One rule for every section: an option declared with
    `opt(..., resume=True)` (cadences, logging, the machine, the optimizer's numbers, train.steps; `--help`
    marks them) may change; any other change is refused, since the run's records (config.yaml, record.json)
    could no longer say truly what trained it."""
    import dataclasses
    import json
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} has no config.yaml; is it a run folder written by accellib.train?")
    stored = load_config(run_dir / "config.yaml")
    kept = {k: v for k, v in kept_options(run_dir).items() if k not in {o[2:].split("=", 1)[0] for o in overrides}}
    cfg = load_config(run_dir / "config.yaml", [f"--{k}={json.dumps(v)}" for k, v in kept.items()] + overrides)
    show = lambda v: str(v).lower() if isinstance(v, bool) else v   # noqa: E731  (as typed)
    for section, obj in cfg.sections().items():
        old = stored.sections()[section]
        for f in dataclasses.fields(obj):
            new_v, old_v = getattr(obj, f.name), getattr(old, f.name)
            if new_v == old_v or f.metadata.get("resume") or (section, f.name) == ("model", "vocab_size"):
                continue  # (vocab_size: filled in from the data)
            key = f"{section}.{f.name}"
            raise ConfigError(f"--{key}={show(new_v)} changes how the run in {run_dir} trains (it was trained with "
                              f"{key}={show(old_v)}); a resume may change only the options `python -m accellib.train "
                              "--help` marks, so drop it, or start a new run with --out")
    now = changed_options(run_dir / "config.yaml", cfg)
    if not now:
        note = f"resuming {run_dir} with its config.yaml"
    else:
        said = lambda ks: ", ".join(f"{k}={show(now[k])}" for k in ks)  # noqa: E731
        mine = [k for k in now if k not in kept]
        old_ones = [k for k in now if k in kept]
        note = (f"resuming {run_dir} with its config.yaml and " + "; ".join(
            ([f"{said(old_ones)} (kept from its last resume; give --KEY=VALUE to change it)"] if old_ones else [])
            + ([f"{said(mine)} (from this command)"] if mine else [])))
    return cfg, note


def run_config(config: str | None, arm: str | None, overrides: list[str]) -> RunConfig:
    """The config to train: a plain config file, or one arm of a compare YAML (its base plus the arm's
    overrides, exactly as `python -m accellib.compare` would train it)."""
    from .drivers.arms import arm_configs, baseline_arm, load_arms
    p = Path(config) if config else None
    raw = read_yaml(p) if p is not None else None
    if isinstance(raw, dict) and "arms" in raw:
        names = list(load_arms(p)[1])
        name = arm or baseline_arm(names)
        return arm_configs(p, [name], overrides)[name]
    if arm:
        raise ConfigError(f"--arm {arm} needs a compare YAML with `arms:` (e.g. configs/tutorial.yaml); "
                          f"{config or 'no --config'} has none")
    return load_config(config, overrides)


def report(e: Exception) -> int:
    """Print a user error as one line (once, from rank 0); 2 is the exit status. Under torchrun the line is also
    torchrun's error file, so torchrun's failure report (which follows it) repeats our line, not a traceback hint.
    Under `accelerate launch`'s one-process launcher (the `--cpu --num_processes N` mis-launch) the launcher
    then exits 1 with its own CalledProcessError naming our status 2: the status of a launcher is the launcher's,
    and ending it with a signal to spare its report (as accellib once did) made it 143, read as "preempted"."""
    import torch.distributed as dist
    line = f"error: {e}"
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
    tell_elastic_launcher(line)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # a clean exit: gloo aborts a process that leaves its group open
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog=prog("train"), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="options (--section.key=value):\n" + help_text())
    ap.add_argument("--config", help="YAML config (see configs/)")
    ap.add_argument("--out", help="output folder of the run")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the run in --out (after the config and data are checked)")
    ap.add_argument("--adopt", metavar="RUN_DIR",
                    help="make a run written before accellib recorded what it writes (no .accellib.json) accellib's: "
                         "all of RUN_DIR is then recorded as accellib's, so --resume continues it and --overwrite "
                         "deletes all of it")
    ap.add_argument("--arm", help="with a compare YAML (one with `arms:`, e.g. configs/tutorial.yaml): train this "
                                  "arm (default: its baseline)")
    args, overrides = ap.parse_known_args(argv)
    try:
        if args.adopt:
            print(adopt_run(Path(args.adopt)))
            return 0
        if args.resume:
            if args.overwrite or args.config:
                raise ConfigError("--resume continues a run with its own config; drop --config/--overwrite")
            run_dir = Path(args.resume)
            cfg, note = resume_config(run_dir, overrides)
            if os.environ.get("RANK", "0") == "0":
                print(note, flush=True)
            final = training_function(cfg, run_dir, resume=True)
        else:
            if not args.out:
                raise ConfigError("--out is required (the folder for metrics, checkpoints and the record)")
            cfg = run_config(args.config, args.arm, overrides)
            final = training_function(cfg, args.out, overwrite=args.overwrite)
    except USER_ERRORS as e:
        return report(e)
    from accelerate.state import PartialState
    if PartialState().is_main_process:
        second = (f"accuracy {final['val_acc']:.4f}" if "val_acc" in final else f"bits/byte {final['val_bpb']:.3f}")
        print(f"final: step {final['step']}  val_loss {final['val_loss']:.4f}  {second}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
