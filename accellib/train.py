"""Command line: train one configuration.

    python -m accellib.train --config configs/tiny.yaml --out runs/tiny [--section.key=value ...]
    python -m accellib.train --resume runs/tiny [--train.steps=600]
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m accellib.train ...
    torchrun --nproc_per_node 2 -m accellib.train ...
    python -m accellib.train --help          (every option with its default)

Writes to --out: config.yaml, metrics.jsonl, checkpoints/last/, record.json, loss.png.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError, RunConfig, help_text, load_config
from .data import DataError
from .launch import LaunchError
from .trainer import Trainer, TrainingError

USER_ERRORS = (ConfigError, DataError, LaunchError, TrainingError)


def training_function(cfg: RunConfig, out: str | Path, resume: bool = False) -> dict:
    """Train `cfg` into `out` (the same function serves the CLI, `accelerate launch` and
    `notebook_launcher`); returns the final metrics on every process."""
    from .plotting import plot_val_curves, save_fig, set_style
    from .records import read_metrics, write_record

    out = Path(out)
    ml = cfg.techniques.get("multilevel")
    if ml is not None and ml.enabled:  # the V-cycle drives one trainer per stage itself
        from .techniques.vcycle import run_vcycle
        return run_vcycle(cfg, out, resume=resume)
    if not resume and (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size:
        raise ConfigError(f"{out} already holds a run; continue it with --resume {out} or choose another --out")
    trainer = Trainer(cfg, out)
    final = trainer.fit(resume=resume)
    if trainer.is_main:
        write_record(out, cfg.to_dict(), final, trainer.accelerator,
                     params=trainer.raw_model.num_params())
        set_style()
        save_fig(plot_val_curves({out.name: read_metrics(out)}, xs=("step", "flops", "wall")), out / "loss.png")
    trainer.accelerator.wait_for_everyone()
    return final


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m accellib.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="options (--section.key=value):\n" + help_text())
    ap.add_argument("--config", help="YAML config (see configs/)")
    ap.add_argument("--out", help="output folder of the run")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    args, overrides = ap.parse_known_args(argv)
    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "config.yaml").exists():
                raise ConfigError(f"{run_dir} has no config.yaml; is it a run folder written by accellib.train?")
            cfg = load_config(run_dir / "config.yaml", overrides)
            final = training_function(cfg, run_dir, resume=True)
        else:
            if not args.out:
                raise ConfigError("--out is required (the folder for metrics, checkpoints and the record)")
            cfg = load_config(args.config, overrides)
            final = training_function(cfg, args.out)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from accelerate.state import PartialState
    if PartialState().is_main_process:
        print(f"final: step {final['step']}  val_loss {final['val_loss']:.4f}  bits/byte {final['val_bpb']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
