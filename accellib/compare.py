"""Command line: several arms trained side by side on the same data, seed and budget; one table, one figure.

The main job: several arms (baseline and techniques) trained side by side on the same data,
seed and budget, then one summary table and one figure.

    python -m accellib.compare --config configs/tutorial.yaml --out runs/quickstart
    python -m accellib.compare --config configs/tutorial.yaml --out runs/q --arms baseline,pld --train.steps=50
    python -m accellib.compare --config configs/tutorial.yaml --out runs/quickstart --resume   (after a crash)
    python -m accellib.compare --config configs/tutorial.yaml --out runs/q5 --budget flops --control dense --seeds 5

The YAML holds a base config plus `arms:`, a mapping arm name -> overrides of the base. Plain arms of
other sizes are named, not written: `dense-L3` is the base with 3 blocks, `dense-L3-d96` also 96 wide;
`--control dense` adds `dense-L1` .. `dense-L<n-1>` (the base's depth is the baseline itself). At
equal FLOPs each trains until it has spent the baseline's FLOPs, with its own LR horizon, exactly as a
technique arm does; the summary then judges every arm against the *dense frontier* (the best plain
model at this budget, chosen without looking at the seed it is judged on; see `frontier`) as well as
against the same-size baseline, by the one paired rule of `accellib.analysis.stats`.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

from . import prog
from .drivers.arms import (CONTROLS, DENSE, arm_configs, baseline_arm, check_data, check_same_data, is_dense,
                           is_plain, load_arms, plan_runs)
from .analysis.frontier import frontier, frontier_edge, paired_gaps  # noqa: F401 (the frontier rule, re-exported)
from .drivers.budget import BUDGETS
from .core.options import ConfigError
from .core.config import RunConfig, load_config
from .core.tasks import make_task
from .core.records import read_metrics, read_record, write_json
from .core.launch import process_state
from .core.run_dir import (LOCK, check_out, file_lock, has_checkpoint, holds_run, is_comparison, is_cwd, main_decides,
                            make_folder, note_written, write_marker)
from .analysis.stats import Paired, crossing, eval_spacing, mean_sd, to_target  # noqa: F401 (crossing: re-exported)
from .train import USER_ERRORS, report, training_function


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
    if is_cwd(out):
        raise ConfigError(f"--out {out} is the current folder; give the comparison a folder of its own, "
                          "e.g. --out runs/quickstart")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the comparison")
    if holds_run(out) or (out / LOCK).exists():  # a training's files, or a training taking the folder now
        raise ConfigError(f"{out} is the folder of a training run, not of a comparison; give the comparison "
                          "a folder of its own with --out")
    if out.is_dir() and not is_comparison(out) and (stray := sorted(p.name for p in out.iterdir())):
        raise ConfigError(f"{out} holds files accellib did not write ({', '.join(stray[:3])}"
                          f"{', ...' if len(stray) > 3 else ''}); a comparison needs a new or empty folder, or one "
                          "of its own: choose another --out")
    held = [n for n in cfgs if holds_run(out / n)]
    if resume and not held and not (out / "budget.json").is_file():
        raise ConfigError(f"{out} holds no comparison to resume; check --out, or start the comparison "
                          "without --resume")
    if held and not (resume or overwrite):
        raise ConfigError(f"{out} already holds arm(s) {', '.join(held)}; continue the comparison with --resume, "
                          "or choose another --out")
    states = {}
    for name, cfg in cfgs.items():
        d = out / name
        if name not in held:
            states[name] = "new"
        elif overwrite:
            states[name] = "replace"
        else:
            stored = _stored_config(d / "config.yaml")
            if stored is not None and (diff := _first_difference(stored, cfg.to_dict())):
                raise ConfigError(f"arm {name} in {out} was trained with another config ({diff}); "
                                  "use the same config and overrides to resume, or choose another --out")
            states[name] = ("done" if (d / "record.json").is_file() else
                            "resume" if has_checkpoint(d) else "replace")  # no checkpoint: start it again
    for name, state in states.items():  # every arm's folder is checked before any arm is trained or deleted
        if state != "done":
            check_out(out / name, resume=state == "resume", overwrite=state == "replace", arm=name)
    return states


def _stored_config(path: Path) -> dict | None:
    """A run's config.yaml filled with today's defaults, so that an option added since it was written
    (at its default) is no difference; its raw YAML if it no longer loads (the comparison then names the key)."""
    if not path.is_file():
        return None
    try:
        return load_config(path).to_dict()
    except ConfigError:
        return yaml.safe_load(path.read_text())


def check_budget(out: Path, budget: str, seeds: int, overwrite: bool) -> None:
    """Arms added to a comparison use its budget and seeds: budget.json holds every arm's planned steps
    (for --budget wall, the only record of them), so a different budget would silently replace it."""
    bfile = out / "budget.json"
    if overwrite or not bfile.is_file():
        return
    now = json.loads(bfile.read_text())
    held = sorted(str(p.parent.relative_to(out)) for p in out.rglob("config.yaml"))
    if (now.get("budget"), now.get("seeds")) != (budget, seeds) and held:
        raise ConfigError(f"{out} holds runs ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) compared with "
                          f"--budget {now.get('budget')} --seeds {now.get('seeds')}; add arms with the same, "
                          "or choose another --out")


def check_arm_names(arms: list[str] | None) -> None:
    """--arms names each arm once, and at least one (one line otherwise: both used to run silently)."""
    if arms is None:
        return
    if not [a for a in arms if a.strip()] or any(not a.strip() for a in arms):
        raise ConfigError(f"--arms {','.join(arms)!r} names an empty arm; give comma-separated arm names, e.g. "
                          "--arms baseline,pld (or leave --arms out to train every arm of the config)")
    twice = sorted({a for a in arms if arms.count(a) > 1})
    if twice:
        raise ConfigError(f"--arms names {', '.join(twice)} more than once; name each arm once")


FEW_STEPS = 0.25  # an arm given under this fraction of the baseline's steps is named (few_steps)


def few_steps(runs: dict[str, RunConfig], plan: dict) -> list[str]:
    """A warning line per arm that its budget gives too few steps to say anything: under FEW_STEPS of the
    baseline's steps, or not even its LR warm-up (e.g. dense-L99 at the baseline's FLOPs)."""
    lines = []
    for label, cfg in runs.items():
        arm = label.split("/")[0]
        p = plan["per_seed"].get("0", {})
        n, n0 = cfg.train.steps, p.get("baseline_steps") or p.get("steps", {}).get(plan["baseline"])
        if arm == plan["baseline"] or n0 is None or label != (arm if plan["seeds"] == 1 else f"{arm}/seed{plan['seed0']}"):
            continue
        if n < FEW_STEPS * n0 or n <= cfg.optim.warmup_steps:
            lines.append(f"warning: arm {arm} gets {n} optimizer step(s) at equal {plan['budget']} (the baseline {n0}; "
                         f"its LR warm-up is {cfg.optim.warmup_steps}), too few to say anything about it; drop it, "
                         "or compare at another budget")
    return lines


def run_arms(config: str | Path, out: str | Path, arms: list[str] | None = None,
             overrides: list[str] | None = None, overwrite: bool = False, resume: bool = False,
             budget: str = "steps", seeds: int = 1, control: str = "none") -> dict[str, dict]:
    """Train each arm (at each seed) into out/<arm>[/seed<k>]. Every run's config and data are checked,
    and what to do with each run already in `out` is decided, before anything is trained or deleted."""
    out = Path(out)
    if seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {seeds}")
    check_arm_names(arms)
    cfgs = arm_configs(config, arms, overrides, control)
    ps = process_state(next(iter(cfgs.values())).train.device)  # launch/device errors before data errors
    check_data(cfgs)
    bfile = out / "budget.json"
    stored = json.loads(bfile.read_text()) if resume and bfile.is_file() else None
    if budget == "wall" and ps.num_processes > 1:
        raise ConfigError("--budget wall times steps in this process; run it with one process (or use --budget flops)")
    base = baseline_arm(list(load_arms(config)[1]))
    base_cfg = None if base in cfgs else arm_configs(config, [base], overrides)[base]
    if base_cfg is not None:
        check_data({base: base_cfg})
    if ps.num_processes > 1:
        check_same_data(cfgs if base_cfg is None else {base: base_cfg, **cfgs}, ps.num_processes)
    runs, plan = plan_runs(cfgs, seeds, budget, ps.num_processes, stored, base_cfg)
    if ps.is_main_process:
        for line in few_steps(runs, plan):
            print(line, flush=True)

    def decide():
        try:
            check_budget(out, budget, seeds, overwrite)
            states = arm_states(out, runs, resume, overwrite)
            make_folder(out)  # (a folder that cannot be created says so here, before anything is trained)
            return None, states
        except ConfigError as e:
            return str(e), None
    err, states = main_decides(decide)
    if err:
        raise ConfigError(err)
    if ps.is_main_process:  # merged with what other invocations (e.g. `--arms pld`, in parallel) stored
        with file_lock(out / ".budget.lock"):
            write_marker(out, "comparison")  # with the record of what a comparison writes (the arms: runs of their own)
            note_written(out, ["budget.json", ".budget.lock", "summary.json", "compare.png"], runs=list(runs))
            now = json.loads(bfile.read_text()) if bfile.is_file() else {}
            if (now.get("budget"), now.get("seeds")) == (budget, seeds):
                for k, p in plan["per_seed"].items():
                    for field in ("steps", "flops_budget", "fingerprint"):
                        p[field] = {**now["per_seed"].get(k, {}).get(field, {}), **p.get(field, {})}
            write_json(bfile, plan)
    results = {}
    for name, cfg in runs.items():
        d, state = out / name, states[name]
        if state == "done":
            results[name] = read_record(d)["final"]
            print(f"{name}: finished before, kept", flush=True)
        else:
            results[name] = training_function(cfg, d, resume=state == "resume", overwrite=state == "replace", arm=name)
    return results


# ----------------------------------------------------------------------------- the summary
def summarize(out: Path, results: dict[str, dict], plan: dict) -> list[dict]:
    """One row per arm over its seeds: final loss (mean, sd), FLOPs and wall (ratios of means to the
    baseline's), and the time to target: FLOPs and wall until the validation loss first reaches the same
    seed's baseline final loss. A seed that never reaches it counts as infinitely slow, so it is never
    dropped from the median: the median is "not reached" when half or more of the seeds miss."""
    base = plan["baseline"]
    results = dict(results)
    for k in range(plan["seeds"]):  # the baseline's finished runs, also when this invocation did not train it
        label = base if plan["seeds"] == 1 else f"{base}/seed{plan['seed0'] + k}"
        if label not in results and (out / label / "record.json").is_file():
            results[label] = read_record(out / label)["final"]
    by_arm: dict[str, list[str]] = {}
    for label in results:
        by_arm.setdefault(label.split("/")[0], []).append(label)
    if base not in by_arm:
        return []
    seed_of = lambda label: label.split("/")[1] if "/" in label else "seed"
    target = {seed_of(lb): results[lb]["val_loss"] for lb in by_arm[base]}
    bflops = statistics.fmean(results[lb]["flops"] for lb in by_arm[base])
    bwall = statistics.fmean(results[lb]["wall"] for lb in by_arm[base])
    bflops_of = {seed_of(lb): results[lb]["flops"] for lb in by_arm[base]}
    bwall_of = {seed_of(lb): max(results[lb]["wall"], 1e-9) for lb in by_arm[base]}
    rows = []
    for arm, labels in by_arm.items():
        recs = {lb: read_metrics(out / lb) for lb in labels}
        paired = [lb for lb in labels if seed_of(lb) in target]  # seeds whose baseline has finished
        hit_f = [crossing(recs[lb], target[seed_of(lb)], "flops") / bflops for lb in paired] or [math.nan]
        hit_w = [crossing(recs[lb], target[seed_of(lb)], "wall") / bwall for lb in paired] or [math.nan]
        ratios = {}
        resolution = max(eval_spacing(recs[lb]) for lb in labels) / bflops   # the sign test's tie, as a budget share
        for x, scale in (("flops", bflops_of), ("wall", bwall_of)):
            hits = [crossing(recs[lb], target[seed_of(lb)], x) / scale[seed_of(lb)] for lb in paired]
            budgets = [(results[lb][x] if x in results[lb] else math.nan) / scale[seed_of(lb)] for lb in paired]
            if paired:
                ratios[x] = to_target(hits, budgets, tie=resolution, what=f"arm {arm} time to target ({x})",
                                      seeds=[seed_of(lb) for lb in paired]).to_dict()
        loss, loss_sd = mean_sd([results[lb]["val_loss"] for lb in labels])
        wall, wall_sd = mean_sd([results[lb]["wall"] for lb in labels])
        flops = statistics.fmean(results[lb]["flops"] for lb in labels)
        rows.append(dict(arm=arm, seeds=len(labels), steps=statistics.fmean(results[lb]["step"] for lb in labels),
                         val_loss=loss, val_loss_sd=loss_sd,
                         val_losses=[results[lb]["val_loss"] for lb in labels],
                         seed_labels=[seed_of(lb) for lb in labels],
                         **_task_metric(results, labels),
                         flops=flops, flops_ratio=flops / bflops, wall_s=wall, wall_sd=wall_sd,
                         wall_ratio=wall / max(bwall, 1e-9),
                         tok_per_s=statistics.fmean(results[lb]["tokens"] / max(results[lb]["wall"], 1e-9) for lb in labels),
                         reached=sum(math.isfinite(h) for h in hit_f),
                         to_target_flops=statistics.median(hit_f), to_target_wall=statistics.median(hit_w),
                         to_target=ratios, to_target_resolution=resolution,
                         params=_params(out / labels[0])))
    order = lambda r: (r["arm"] != base, is_dense(r["arm"]), int(DENSE.match(r["arm"]).group(1)) if is_dense(r["arm"]) else 0)
    return sorted(rows, key=order)


def _params(run: Path) -> int | None:
    """The run's parameter count (all parameters) from its record, None before it has one."""
    return read_record(run).get("params") if (run / "record.json").is_file() else None


def _task_metric(results: dict, labels: list[str]) -> dict:
    """The task's second validation metric over an arm's seeds: bits per byte (language) or accuracy
    (images, mean and sd)."""
    if "val_acc" in results[labels[0]]:
        acc, acc_sd = mean_sd([results[lb]["val_acc"] for lb in labels])
        return dict(val_acc=acc, val_acc_sd=acc_sd, val_accs=[results[lb]["val_acc"] for lb in labels])
    return dict(bits_per_byte=statistics.fmean(results[lb]["val_bpb"] for lb in labels))


def format_gaps(rows: list[dict], front: dict) -> str:
    """The paired verdicts: each arm minus the baseline, and minus the dense frontier, per seed; mean
    [95% t-interval] (seeds): wins / loses / not resolved (`accellib.analysis.stats`)."""
    picks = set(front.get("per_seed", {}).values()) if front else set()
    text = lambda r, k: ("— (the frontier itself)" if k == "vs_frontier" and picks == {r["arm"]}   # no row against itself
                         else _paired_text(r[k]) if k in r else "-")
    has_front = any("vs_frontier" in r for r in rows)
    w = max(16, *(len(r["arm"]) + 2 for r in rows))
    head = f"{'arm':<{w}}{'vs baseline (nats)':<48}" + ("vs dense frontier (nats)" if has_front else "")
    lines = [head, "-" * (w + 48 + (46 if has_front else 0))]
    for r in rows:
        lines.append(f"{r['arm']:<{w}}{text(r, 'vs_baseline'):<48}" + (text(r, "vs_frontier") if has_front else ""))
    if front:
        picks = sorted(set(front["per_seed"].values()))
        lines.append(f"frontier: {', '.join(picks)} (chosen per seed on the other seeds' mean; see accellib.compare.frontier)")
        if front.get("bracketed") is False:
            lines.append(f"warning: the frontier's minimum is at the edge of the arms tried ({', '.join(front['edge'])}); "
                         "add plain arms beyond it (dense-L<n>[-d<w>]) before reading the frontier as the best plain model")
    return "\n".join(lines)


def _paired_text(d: dict) -> str:
    return Paired.from_dict(d).text()


def format_table(rows: list[dict]) -> str:
    """The summary as text; with several seeds, loss and wall are mean ± sd, the time to target a median."""
    sd = any(r["seeds"] > 1 for r in rows)
    pm = lambda v, s, f: f"{v:{f}} ± {s:{f}}" if sd else f"{v:{f}}"
    tt = lambda v: "not reached" if not math.isfinite(v) else f"{v:.2f}"
    acc = "val_acc" in rows[0]  # an image task: accuracy where a language task shows bits per byte
    w2 = (17 if sd else 9) if acc else 10
    second = (lambda r: f"{pm(r['val_acc'], r['val_acc_sd'], '.3f'):>{w2}}") if acc else (lambda r: f"{r['bits_per_byte']:>10.3f}")
    head = (f"{'arm':<16}{'steps':>6}{'val loss':>{17 if sd else 9}}{'val acc' if acc else 'bits/byte':>{w2}}{'xFLOPs':>8}"
            f"{'wall s':>{15 if sd else 8}}{'xwall':>7}  {'to target: xFLOPs':>18}{'xwall':>12}{'reached':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['arm']:<16}{r['steps']:>6.0f}{pm(r['val_loss'], r['val_loss_sd'], '.3f'):>{17 if sd else 9}}"
                     f"{second(r)}{r['flops_ratio']:>8.2f}{pm(r['wall_s'], r['wall_sd'], '.1f'):>{15 if sd else 8}}"
                     f"{r['wall_ratio']:>7.2f}  {tt(r['to_target_flops']):>18}{tt(r['to_target_wall']):>12}"
                     f"{str(r['reached']) + '/' + str(r['seeds']):>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("compare"), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tutorial.yaml")
    ap.add_argument("--out", default="runs/quickstart")
    ap.add_argument("--arms", help="comma-separated subset of the config's arms")
    ap.add_argument("--budget", default="steps", choices=BUDGETS,
                    help="what every arm spends as much of as the baseline: optimizer steps (the papers' "
                         "protocol), FLOPs, or wall time (paired timing); schedules stretch to each arm's horizon")
    ap.add_argument("--seeds", type=int, default=1, help="train every arm with seeds seed, seed+1, ...; "
                                                          "the table gives mean ± sd and paired gaps by seed")
    ap.add_argument("--control", default="none", choices=CONTROLS,
                    help="dense: also train plain models of every smaller depth (dense-L1 ..) to the same budget, "
                         "and judge every arm against the best of them (the dense frontier)")
    ap.add_argument("--overwrite", action="store_true", help="replace earlier runs of these arms in --out")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted comparison: finished arms are kept, a started one resumes")
    ap.add_argument("--lm-eval", nargs="?", const="corpus_ppl,corpus_cloze", metavar="TASKS",
                    help="also score every run with lm-evaluation-harness (accellib/evaluate.py; default tasks: "
                         "the offline corpus_ppl,corpus_cloze) and print a second table")
    ap.add_argument("--lm-eval-limit", type=int, default=None, metavar="N", help="documents per lm-eval task")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        results = run_arms(args.config, args.out, args.arms.split(",") if args.arms is not None else None,
                           overrides, args.overwrite, args.resume, args.budget, args.seeds, args.control)
    except USER_ERRORS as e:
        return report(e)
    from accelerate.state import PartialState
    if PartialState().is_main_process:
        from .analysis.plotting import plot_val_curves, save_fig, set_style
        out = Path(args.out)
        plan = json.loads((out / "budget.json").read_text())
        rows = summarize(out, results, plan)
        if not rows:
            print(f"no finished {plan['baseline']} run in {out} yet: the table compares with it, run that arm too")
            return 0
        print(f"budget: equal {args.budget}, {args.seeds} seed(s); to target = until the validation loss first "
              "reaches the same seed's baseline final loss (ratios to the baseline's mean FLOPs and wall)")
        print(format_table(rows))
        front = paired_gaps(rows, plan["baseline"])
        print(f"\npaired by seed: arm minus control, mean [95% t-interval] (seeds): verdict (accellib.analysis.stats)")
        print(format_gaps(rows, front))
        summary = dict(budget=args.budget, seeds=args.seeds, rows=rows, frontier=front)
        if args.lm_eval:
            from .evaluate import evaluate_arms
            summary["lm_eval"], text = evaluate_arms(out, list(results), tuple(args.lm_eval.split(",")),
                                                     args.lm_eval_limit)
            print(f"lm-evaluation-harness ({args.lm_eval}; mean ± sd over seeds):\n{text}")
        write_json(out / "summary.json", summary)
        set_style()
        save_fig(plot_val_curves({a: read_metrics(out / a) for a in results}, references=_references(results, out)),
                 out / "compare.png")
        print(f"figure: {out / 'compare.png'}")
    return 0


def _references(results: dict, out: Path) -> dict:
    cfg = load_config(out / next(iter(results)) / "config.yaml")
    return make_task(cfg).references()


if __name__ == "__main__":
    sys.exit(main())
