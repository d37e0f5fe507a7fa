"""The main job: several arms (baseline and techniques) trained side by side on the same data,
seed and budget, then one summary table and one figure.

    python -m accellib.compare --config configs/quickstart.yaml --out runs/quickstart
    python -m accellib.compare --config configs/quickstart.yaml --out runs/q --arms baseline,pld --train.steps=50

The YAML holds a base config plus `arms:`, a mapping arm name -> overrides of the base.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import yaml

from .config import ConfigError, apply_dict, load_config, parse_overrides
from .train import USER_ERRORS, training_function


def load_arms(path: str | Path) -> tuple[dict, dict]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} not found; see configs/ for the shipped ones")
    raw = yaml.safe_load(p.read_text()) or {}
    arms = raw.pop("arms", None) or {"baseline": {}}
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


def run_arms(config: str | Path, out: str | Path, arms: list[str] | None = None,
             overrides: list[str] | None = None, overwrite: bool = False) -> dict[str, dict]:
    base, all_arms = load_arms(config)
    names = arms or list(all_arms)
    unknown = [a for a in names if a not in all_arms]
    if unknown:
        raise ConfigError(f"unknown arm {unknown[0]!r}; {config} defines {', '.join(all_arms)}")
    cli = parse_overrides(overrides or [])
    results = {}
    for name in names:
        cfg = load_config(None, None, extra=base)
        apply_dict(cfg, all_arms[name] or {})
        apply_dict(cfg, cli)
        if overwrite:  # the user asked to replace earlier runs of these arms. Every rank deletes
            # (races are ignored): no Accelerate state may exist yet, and the first collective in
            # the trainer orders these deletions before any rank writes the new run.
            shutil.rmtree(Path(out) / name, ignore_errors=True)
        results[name] = training_function(cfg, Path(out) / name)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accellib.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--out", default="runs/quickstart")
    ap.add_argument("--arms", help="comma-separated subset of the config's arms")
    ap.add_argument("--overwrite", action="store_true", help="replace earlier runs of these arms in --out")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        results = run_arms(args.config, args.out, args.arms.split(",") if args.arms else None,
                           overrides, args.overwrite)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
