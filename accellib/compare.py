"""The main job: several arms (baseline and techniques) trained side by side on the same data,
seed and budget, then one summary table and one figure.

    python -m accellib.compare --config configs/quickstart.yaml --out runs/quickstart
    python -m accellib.compare --config configs/quickstart.yaml --out runs/q --arms baseline,pld --train.steps=50
    python -m accellib.compare --config configs/quickstart.yaml --out runs/quickstart --resume   (after a crash)

The YAML holds a base config plus `arms:`, a mapping arm name -> overrides of the base.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from .config import ConfigError, RunConfig, apply_dict, load_config, parse_overrides
from .data import load_token_data
from .records import read_record
from .launch import process_state
from .run_dir import has_checkpoint, holds_run, main_decides
from .train import USER_ERRORS, report, training_function


def load_arms(path: str | Path) -> tuple[dict, dict]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} not found; see configs/ for the shipped ones")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p} must be a mapping of sections and `arms:`, got "
                          f"{'an empty file' if raw is None else 'a ' + type(raw).__name__}; see configs/quickstart.yaml")
    arms = raw.pop("arms", None) or {"baseline": {}}
    if not isinstance(arms, dict):
        raise ConfigError(f"`arms:` in {p} must map arm names to overrides, e.g. `pld: {{pld: {{enabled: true}}}}`")
    return raw, arms


def summary_rows(results: dict[str, dict]) -> list[dict]:
    base = results.get("baseline") or next(iter(results.values()))
    rows = []
    for arm, r in results.items():
        rows.append(dict(arm=arm, val_loss=r["val_loss"], bits_per_byte=r["val_bpb"],
                         tok_per_s=r["tokens"] / max(r["wall"], 1e-9), flops=r["flops"],
                         flops_ratio=r["flops"] / base["flops"], wall_s=r["wall"],
                         wall_ratio=r["wall"] / max(base["wall"], 1e-9)))
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'arm':<14}{'val loss':>9}{'bits/byte':>10}{'tok/s':>9}{'FLOPs':>10}{'xFLOPs':>8}{'wall s':>8}{'xwall':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['arm']:<14}{r['val_loss']:>9.3f}{r['bits_per_byte']:>10.3f}{r['tok_per_s']:>9.0f}"
                     f"{r['flops']:>10.2e}{r['flops_ratio']:>8.2f}{r['wall_s']:>8.1f}{r['wall_ratio']:>7.2f}")
    return "\n".join(lines)


def arm_configs(config: str | Path, arms: list[str] | None, overrides: list[str] | None) -> dict[str, RunConfig]:
    """Every arm's config: the base, the arm's overrides, the command line's; validated."""
    base, all_arms = load_arms(config)
    names = arms or list(all_arms)
    unknown = [a for a in names if a not in all_arms]
    if unknown:
        raise ConfigError(f"unknown arm {unknown[0]!r}; {config} defines {', '.join(all_arms)}")
    cli = parse_overrides(overrides or [])
    cfgs = {}
    for name in names:
        cfg = load_config(None, None, extra=base)
        apply_dict(cfg, all_arms[name] or {})
        cfgs[name] = apply_dict(cfg, cli)
    return cfgs


def check_data(cfgs: dict[str, RunConfig]) -> None:
    """Open every arm's data (a DataError before anything is deleted) and fill in vocab_size, so the
    configs compare equal to the ones stored in the arms' folders."""
    vocab = {}
    for cfg in cfgs.values():
        if cfg.data.path not in vocab:
            vocab[cfg.data.path] = load_token_data(cfg.data.path).vocab_size
        cfg.model.vocab_size = cfg.model.vocab_size or vocab[cfg.data.path]


def _first_difference(a: dict, b: dict, prefix: str = "") -> str | None:
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            if (d := _first_difference(va, vb, f"{prefix}{k}.")) is not None:
                return d
        elif va != vb:
            return f"{prefix}{k}: {va!r} in the run, {vb!r} now"
    return None


def arm_states(out: Path, cfgs: dict[str, RunConfig], resume: bool, overwrite: bool) -> dict[str, str]:
    """What to do with each arm: "new", "replace", "resume" or "done" (raises a one-line ConfigError
    when the folder holds arms and neither --resume nor --overwrite says what to do with them)."""
    if resume and overwrite:
        raise ConfigError("--resume keeps finished arms and --overwrite replaces them; choose one")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the comparison")
    held = [n for n in cfgs if holds_run(out / n)]
    if held and not (resume or overwrite):
        raise ConfigError(f"{out} already holds arm(s) {', '.join(held)}; continue the comparison with --resume, "
                          "or replace them with --overwrite (or choose another --out)")
    states = {}
    for name, cfg in cfgs.items():
        d = out / name
        if name not in held:
            states[name] = "new"
        elif overwrite:
            states[name] = "replace"
        else:
            stored = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").is_file() else None
            if stored is not None and (diff := _first_difference(stored, cfg.to_dict())):
                raise ConfigError(f"arm {name} in {out} was trained with another config ({diff}); "
                                  "use the same config and overrides to resume, or --overwrite")
            states[name] = ("done" if (d / "record.json").is_file() else
                            "resume" if has_checkpoint(d) else "replace")  # no checkpoint: start it again
    return states


def run_arms(config: str | Path, out: str | Path, arms: list[str] | None = None,
             overrides: list[str] | None = None, overwrite: bool = False, resume: bool = False) -> dict[str, dict]:
    """Train each arm into out/<arm>. Every arm's config and data are checked, and what to do with
    each arm already in `out` is decided, before anything is trained or deleted."""
    out = Path(out)
    cfgs = arm_configs(config, arms, overrides)
    process_state(next(iter(cfgs.values())).train.device)  # launch/device errors before data errors
    check_data(cfgs)

    def decide():
        try:
            return None, arm_states(out, cfgs, resume, overwrite)
        except ConfigError as e:
            return str(e), None
    err, states = main_decides(decide)
    if err:
        raise ConfigError(err)
    results = {}
    for name, cfg in cfgs.items():
        d, state = out / name, states[name]
        if state == "done":
            results[name] = read_record(d)["final"]
            print(f"{name}: finished before, kept", flush=True)
        else:
            results[name] = training_function(cfg, d, resume=state == "resume", overwrite=state == "replace")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accellib.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--out", default="runs/quickstart")
    ap.add_argument("--arms", help="comma-separated subset of the config's arms")
    ap.add_argument("--overwrite", action="store_true", help="replace earlier runs of these arms in --out")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted comparison: finished arms are kept, a started one resumes")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        results = run_arms(args.config, args.out, args.arms.split(",") if args.arms else None,
                           overrides, args.overwrite, args.resume)
    except USER_ERRORS as e:
        return report(e)
    from accelerate.state import PartialState
    if PartialState().is_main_process:
        from .plotting import plot_val_curves, save_fig, set_style
        from .records import read_metrics, write_json
        rows = summary_rows(results)
        print(format_table(rows))
        write_json(Path(args.out) / "summary.json", rows)
        set_style()
        save_fig(plot_val_curves({a: read_metrics(Path(args.out) / a) for a in results}),
                 Path(args.out) / "compare.png")
        print(f"figure: {Path(args.out) / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
