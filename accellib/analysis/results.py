"""The results cache that notebooks read (results/<name>.json) and the tables drawn from it.

The results cache that notebooks read: results/<name>.json written by `make results`
(benchmarks/reproduce.py), each the summary, the budget plan and every run's curves of one
multi-seed `accellib.compare` experiment, with its config, commit, versions and wall time.

    res = load_result("tutorial_flops")             # every arm at the baseline's FLOPs, 5 seeds
    row = arm_row(res, "pld")                       # mean/sd loss, ratios, time to target
    print(gap_table(res))                           # paired gaps to the baseline and the dense frontier
    check_live(live_final, res, "pld")              # the notebook's live run against the cached one
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .. import repo_root
from .plotting import X_LABELS, arm_color, arm_linestyle, draw_references
from .stats import Paired, Ratio



class ResultMissing(FileNotFoundError):
    """A results/<name>.json that `make results` has not written."""


def load_result(name: str, folder: Path | None = None) -> dict:
    p = Path(folder or repo_root("the results cache (results/)") / "results") / f"{name}.json"
    if not p.is_file():
        raise ResultMissing(f"{p} is missing; write it with: python benchmarks/reproduce.py --only {name}")
    return json.loads(p.read_text())


def arm_row(res: dict, arm: str) -> dict:
    rows = {r["arm"]: r for r in res["summary"]["rows"]}
    if arm not in rows:
        raise KeyError(f"{res['name']} has no arm {arm!r}; it has {', '.join(rows)}")
    return rows[arm]


def arm_runs(res: dict, arm: str) -> dict[str, list[dict]]:
    """{'arm/seed<k>': curve} of one arm's seeds."""
    return {k: v for k, v in res["curves"].items() if k.split("/")[0] == arm}


def seed_run(res: dict, arm: str, seed: int | None = None) -> list[dict]:
    """One seed's curve (the config's own seed by default: the run a notebook repeats live)."""
    seed = res["budget"]["seed0"] if seed is None else seed
    return res["curves"][f"{arm}/seed{seed}" if res["summary"]["seeds"] > 1 else arm]


def check_live(live_final: dict, res: dict, arm: str, tol: float = 0.02) -> float:
    """Assert that a notebook's live run (same config and seed as the cached run) ends within `tol` nats
    of the cached run's final validation loss; returns the difference. Same code and seed give the same
    loss up to the CPU's float rounding (1e-4 to 1e-3 nats between kernel paths); a changed technique,
    schedule or config moves it by far more than `tol`."""
    cached = [r for r in seed_run(res, arm) if "val_loss" in r][-1]
    diff = live_final["val_loss"] - cached["val_loss"]
    assert live_final["step"] == cached["step"], (live_final["step"], cached["step"])
    assert abs(diff) < tol, f"live {arm} run ends at {live_final['val_loss']:.4f}, the cache at {cached['val_loss']:.4f}"
    return diff


def frontier_arm(res: dict) -> str | None:
    """The dense frontier's arm of an equal-FLOPs result: the plain arm the frontier rule picked for the
    most seeds (`accellib.compare.frontier`); None when the experiment ran no dense arms."""
    picks = list(res["summary"].get("frontier", {}).get("per_seed", {}).values())
    return max(sorted(set(picks)), key=picks.count) if picks else None


def gap(res: dict, arm: str, control: str = "frontier") -> Paired | None:
    """An arm's paired gap (arm - control per seed, `accellib.analysis.stats`) to "baseline" or "frontier"."""
    d = arm_row(res, arm).get(f"vs_{control}")
    return None if d is None else Paired.from_dict(d)


def verdicts(res: dict, control: str = "frontier") -> dict[str, str]:
    """{arm: verdict} of every arm against the control ("baseline" or "frontier")."""
    return {r["arm"]: r[f"vs_{control}"]["verdict"] for r in res["summary"]["rows"] if f"vs_{control}" in r}


def gap_table(res: dict, arms: list[str] | None = None) -> str:
    """Each arm's final loss (mean ± sd over seeds) and its paired gaps to the same-size baseline and to the
    dense frontier: mean [95% t-interval] (seeds): verdict. The one rule of `accellib.analysis.stats`."""
    rows = [r for r in res["summary"]["rows"] if arms is None or r["arm"] in arms]
    w = max(len(r["arm"]) for r in rows) + 2
    picks = set(res["summary"].get("frontier", {}).get("per_seed", {}).values())
    txt = {r["arm"]: ["— (the frontier itself)" if c == "frontier" and picks == {r["arm"]}   # no row against itself
                      else gap(res, r["arm"], c).text() if f"vs_{c}" in r else "-" for c in ("baseline", "frontier")]
           for r in rows}
    w2 = max(len(t[0]) for t in txt.values()) + 3
    out = [f"{'arm':<{w}}{'val loss (mean ± sd)':>20}   {'vs baseline':<{w2}}{'vs dense frontier'}"]
    for r in rows:
        t = txt[r["arm"]]
        out.append(f"{r['arm']:<{w}}{r['val_loss']:>11.3f} ± {r['val_loss_sd']:.3f}   {t[0]:<{w2}}{t[1]}")
    if (f := frontier_arm(res)) is not None:
        out.append(f"frontier: {f} (picked for {sum(v == f for v in res['summary']['frontier']['per_seed'].values())}"
                   f" of {res['summary']['seeds']} seeds, each chosen on the other seeds)")
    return "\n".join(out)


def fmt_to_target(x: float) -> str:
    return "not reached" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def plot_arms(res: dict, arms: list[str], xs=("flops", "wall"), references: dict | None = None, title=None,
              frontier: bool = True):
    """Validation loss of each arm's seeds (thin) and their mean (thick, at the evaluation points all
    seeds share), against each x in `xs`; one colour per arm, unigram/bigram lines. An equal-FLOPs result
    with dense arms also draws its frontier arm (grey, dashed) unless `frontier=False`: the control that
    decides belongs on every equal-compute figure."""
    import matplotlib.pyplot as plt
    f = frontier_arm(res) if frontier else None
    arms = list(arms) + ([f] if f is not None and f not in arms else [])
    fig, axes = plt.subplots(1, len(xs), figsize=(5 * len(xs), 3.2), squeeze=False)
    for ax, x in zip(axes[0], xs):
        for arm in arms:
            c = arm_color(arm)
            curves = [[r for r in recs if "val_loss" in r and not r.get("transition")]
                      for recs in arm_runs(res, arm).values()]
            for recs in curves:
                ax.plot([r[x] for r in recs], [r["val_loss"] for r in recs], color=c, lw=0.7, alpha=0.4,
                        ls=arm_linestyle(arm))
            n = min(len(v) for v in curves)
            mean_x = [sum(v[i][x] for v in curves) / len(curves) for i in range(n)]
            mean_y = [sum(v[i]["val_loss"] for v in curves) / len(curves) for i in range(n)]
            ax.plot(mean_x, mean_y, color=c, lw=2, ls=arm_linestyle(arm),
                    label=f"{arm}{' = frontier' if arm == f else ''} (mean of {len(curves)} seeds)")
        draw_references(ax, references)
        ax.set_xlabel(X_LABELS.get(x, x))
        ax.set_ylabel("validation loss (nats/token)")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plain_profile(*results: dict) -> dict[str, dict]:
    """The IsoFLOP profile of equal-FLOPs results that share a budget (and their baseline runs): per plain arm
    (baseline, dense-*), its parameters (all), tokens per parameter, per-seed final losses, mean and SE, sorted by
    size; an arm in several results is taken from the last."""
    from .stats import mean_se
    out = {}
    for res in results:
        for r in res["summary"]["rows"]:
            a = r["arm"]
            if a == "baseline" or a.startswith("dense-L"):
                g = res["regime"][a]
                m, se = mean_se(r["val_losses"])
                out[a] = dict(params=g["params"], tokens_per_param=g["tokens_per_param"], losses=r["val_losses"],
                              loss=m, se=se, steps=r["steps"])
    return dict(sorted(out.items(), key=lambda kv: kv[1]["params"]))


def plot_profile(ax, profile: dict[str, dict], label: str, color: str = "#555555", marker: str = "o"):
    """One IsoFLOP curve on `ax`: final loss (mean ± SE, seeds as dots) against parameters (all, log axis), the
    baseline starred, each point labelled by its shape (L<blocks>[-d<width>])."""
    xs = [p["params"] for p in profile.values()]
    for a, p in profile.items():
        ax.scatter([p["params"]] * len(p["losses"]), p["losses"], s=8, color=arm_color(a), alpha=0.5)
        ax.annotate(a.replace("dense-", "") if a != "baseline" else "baseline", (p["params"], p["loss"]),
                    textcoords="offset points", xytext=(4, 5), fontsize=7)
    ax.errorbar(xs, [p["loss"] for p in profile.values()], yerr=[p["se"] for p in profile.values()], color=color,
                marker=marker, ms=4, capsize=3, label=label)
    b = profile["baseline"]
    ax.plot([b["params"]], [b["loss"]], "*", ms=13, color=arm_color("baseline"), mec="white", zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel("parameters N (all)")
    ax.set_ylabel("final val loss (nats/token)")


# What each paper reports for its own setting (the sources in shared/seeds and each notebook's header), beside our
# tutorial-scale measurements in the README's findings table
PAPER_CLAIMS = {
    "pld": "BERT: −25% FLOPs, −24% wall time (Zhang & He 2020)",
    "sbld": "GPT-3 Medium: −19.7% training time (Zeng et al. 2023)",
    "random_ltd": "GPT-3 1.3B: −33% compute, −26% wall time, same zero-shot (Yao et al. 2022)",
    "multilevel": "BERT/GPT-Base: −20% compute; BERT-Large −52% (Zou et al. 2024)",
}


def regime_line(res: dict, arm: str = "baseline") -> str:
    """Where an arm of a cached experiment stands: '57,264 parameters (all), 2,867,200 tokens: 50.1 tokens per
    parameter (2.5x Hoffmann et al.'s ~20), 0.63 epochs' (accellib.analysis.regime; `reproduce.py` records it).
    The ~20 is Hoffmann et al.'s compute-optimum at their scale, not ours: where an experiment stands against its
    own family's optimum is read from its IsoFLOP profile (`accellib.analysis.regime.past_optimum`)."""
    g = res["regime"][arm]
    return (f"{g['params']:,} parameters (all), {g['tokens']:,} tokens: {g['tokens_per_param']:.1f} tokens per "
            f"parameter ({g['vs_compute_optimal']:.2g}x Hoffmann et al.'s ~20), {g['epochs']:.2f} epochs")


def to_target(res: dict, arm: str, x: str = "flops", extra: float = 0.0) -> Ratio | None:
    """An arm's time to target (the papers' metric; `accellib.analysis.stats.to_target`): what it spent, as a ratio
    to the same seed's baseline, to first reach that baseline's final validation loss; x = "flops" or "wall".
    A stored record is judged again by today's rule (the sign test at the row's `to_target_resolution`), from its
    per-seed ratios: old caches give today's judgement without retraining. A cache that stores none (written before
    issue 33) gets the FLOPs one from its curves, by compare's own functions; its wall one is None (those caches'
    wall columns ran beside other jobs). `extra`: FLOPs the cache left out of every seed's run (SBLD's profile in
    the tutorial caches), added to each seed's crossing and budget; the record is then read from the curves."""
    row = arm_row(res, arm)
    d = row.get("to_target", {}).get(x)
    if d is not None and not extra:
        return Ratio.from_dict(d, tie=row.get("to_target_resolution"))
    if x != "flops" or "curves" not in res:
        return None
    from .stats import crossing, eval_spacing, to_target as judge_to_target
    base = res.get("budget", {}).get("baseline", "baseline")
    hits, budgets, seeds, spacing = [], [], [], []
    bflops = []
    for label, recs in arm_runs(res, arm).items():
        seed = label.split("/")[-1]
        b = [r for r in res["curves"][f"{base}/{seed}"] if "val_loss" in r][-1]
        hits.append((crossing(recs, b["val_loss"], "flops") + extra) / b["flops"])
        budgets.append((recs[-1]["flops"] + extra) / b["flops"])
        seeds.append(seed)
        spacing.append(eval_spacing(recs))
        bflops.append(b["flops"])
    if not hits:
        return None
    tie = max(spacing) / (sum(bflops) / len(bflops))   # compare.summarize's to_target_resolution
    return judge_to_target(hits, budgets, tie=tie, what=f"{arm} FLOPs to target", seeds=seeds)


def peak_lr(res: dict) -> float:
    """The baseline's peak LR in a cached experiment: the generated config's where `reproduce.py` wrote one (an
    experiment run at another LR than its base config's, e.g. ot_flops_lr), else the config's."""
    return (res.get("generated_config") or res["config"])["optim"]["lr"]


def regime_reading(res: dict, arm: str, name: str) -> str:
    """One technique in one equal-FLOPs experiment, as the decision rules of notebooks 01-04 quote it: where the
    baseline stands (its tokens per parameter; with a bracketed IsoFLOP profile, the regime's name and how far past
    the family's optimum, `accellib.analysis.regime.past_optimum`), then the arm's gap to the same-size baseline at
    equal FLOPs (the test), its FLOPs to the baseline's final loss (the papers' metric) and its gap to the dense
    frontier, each by the one rule, at the baseline's peak LR (every arm shares it). `name` is the technique as the
    text calls it ('PLD')."""
    from .regime import past_optimum, regime_name
    tpp = res["regime"]["baseline"]["tokens_per_param"]
    where = f"{res['name']}, baseline at {tpp:.0f} tokens per parameter, peak LR {peak_lr(res):.3g}"
    if frontier_arm(res) is not None:          # plain arms of other sizes: the baseline placed on their profile
        p = past_optimum(res)
        where += (f", {p['times']:.1f}x those of its family's best plain model at its FLOPs ({p['optimum']}, "
                  f"{p['optimum_tokens_per_param']:.0f}): {regime_name(res)}")
    tt, fr = to_target(res, arm, "flops"), gap(res, arm, "frontier")
    return (f"{where}\n  {name} - same-size baseline at equal FLOPs: {gap(res, arm, 'baseline').text()}\n"
            f"  FLOPs to the baseline's final loss: {tt.text()}\n"
            f"  {name} - dense frontier ({frontier_arm(res)}): {'—' if fr is None else fr.text()}")


def _short(p) -> str:
    """A paired gap or a time to target in a table cell: '-0.175 [-0.198, -0.152] wins'; 'stats.Ratio.short'."""
    if p is None:
        return "—"
    if isinstance(p, Ratio):
        return p.short()
    word = p.verdict.replace("not resolved at", "n.r. at").replace("not resolved", "n.r.")
    return f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}] {word}"


def regime_table(res: dict, arms: list[str] | None = None) -> str:
    """An equal-FLOPs experiment, per arm: the papers' metric (FLOPs and wall to the same seed's baseline final
    loss: seeds that reached it, the ratio [95% interval] where every seed did or else the median of those that did,
    and the sign test's p and verdict; `stats.Ratio.short`), and the final-loss gaps to the same-size baseline and to
    the dense frontier, paired by seed (the one rule of accellib.analysis.stats)."""
    rows = [r for r in res["summary"]["rows"] if arms is None or r["arm"] in arms]
    w = max(len(r["arm"]) for r in rows) + 2
    base = res.get("budget", {}).get("baseline", "baseline")
    picks = set(res["summary"].get("frontier", {}).get("per_seed", {}).values())
    itself = lambda a, c: (a == base and c != "frontier") or (c == "frontier" and picks == {a})
    cell = lambda a, c, p: "— (the control itself)" if itself(a, c) else _short(p)   # no row against itself
    cells = {r["arm"]: [cell(r["arm"], "to", to_target(res, r["arm"], "flops")),
                        cell(r["arm"], "to", to_target(res, r["arm"], "wall")),
                        cell(r["arm"], "baseline", gap(res, r["arm"], "baseline")),
                        cell(r["arm"], "frontier", gap(res, r["arm"], "frontier"))] for r in rows}
    heads = ["FLOPs to target", "wall to target", "vs same-size baseline", "vs dense frontier"]
    ws = [max(len(h), *(len(c[k]) for c in cells.values())) + 2 for k, h in enumerate(heads)]
    out = [f"{'arm':<{w}}" + "".join(f"{h:<{ws[k]}}" for k, h in enumerate(heads))]
    for r in rows:
        out.append(f"{r['arm']:<{w}}" + "".join(f"{c:<{ws[k]}}" for k, c in enumerate(cells[r["arm"]])))
    return "\n".join(out)


def config_differences(a, b, skip=("train.log_every", "train.checkpoint_every")) -> list[tuple[str, object, object]]:
    """What differs between two comparison YAMLs (e.g. configs/tutorial.yaml and configs/fixed_size_long.yaml),
    setting by setting: [(key, value in a, value in b)], keys dotted ('model.d_model', 'arms.pld.pld.gamma'), only
    keys both set, in the files' order; `skip` leaves out settings that do not change training (logging,
    checkpoints). A comparison between two experiments reads an effect of the one difference it names only when
    this list holds nothing else."""
    import yaml

    def flat(d, pre=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{pre}{k}.") if isinstance(v, dict) else {f"{pre}{k}": v})
        return out

    fa, fb = (flat(yaml.safe_load(Path(p).read_text())) for p in (a, b))
    return [(k, fa[k], fb[k]) for k in fa if k in fb and fa[k] != fb[k] and k not in skip]


TECHNIQUES = ("pld", "sbld", "random_ltd", "multilevel", "pld+random_ltd", "sbld+random_ltd")


def findings_table(long_res: dict, tut_res: dict, tut_frontier: dict | None = None, gpu: dict | None = None) -> str:
    """The README's findings, made from the cache (a test checks the README and docs/results.md hold exactly this):
    per technique, what its paper claims; ours in `long_res`, the regime its own IsoFLOP profile names
    (`regime.regime_name`: the README passes ot_flops, the papers' regime; docs/results.md also long_flops, near
    compute-optimal): FLOPs to reach the same-size baseline's final loss (no wall column: the runs shared a busy 2-core CPU under
    loads that differed between arms, so their clocks measure the load, not the technique; the GPU column does) (`stats.Ratio.short`: no interval where a seed is
    censored, the sign test's verdict), and the equal-FLOPs gaps to the same-size baseline and to the dense frontier;
    ours at the tutorial budget (an under-trained model): the gaps to the same-size baseline and to the frontier
    (bracketed by `tut_frontier`, the tutorial_frontier experiment, when given); the GPU column from `gpu`, a record
    of the reworked GPU check (`gpu_cells`; "not measured" without one)."""
    from .frontier import joint_frontier
    tut_rows = {r["arm"]: r for r in (joint_frontier(tut_res, tut_frontier)["rows"] if tut_frontier else
                                      tut_res["summary"]["rows"])}
    tut_front = lambda a: Paired.from_dict(tut_rows[a]["vs_frontier"]) if "vs_frontier" in tut_rows.get(a, {}) else None
    g = lambda res: res["regime"]["baseline"]["tokens_per_param"]
    n = lambda res: res["summary"]["seeds"]
    gpu_cell = gpu_cells(gpu)
    res_ = max(arm_row(long_res, a)["to_target_resolution"] for a in ("baseline", *TECHNIQUES))
    from .regime import regime_name
    lines = [f"| arm | paper's claim | {regime_name(long_res)} ({g(long_res):.0f} tokens/param, peak LR "
             f"{peak_lr(long_res):.3g}, {n(long_res)} seeds): "
             f"FLOPs to the baseline's loss (read to {res_:.1%} of the budget) | equal FLOPs: vs same size | "
             "vs dense frontier | "
             f"tutorial ({g(tut_res):.1f} tokens/param, {n(tut_res)} seeds): vs same size | vs dense frontier | "
             f"{gpu_heading(gpu)} |",
             "|---|---|---|---|---|---|---|---|"]
    for a in TECHNIQUES:
        lines.append(f"| {a} | {PAPER_CLAIMS.get(a, 'not claimed')} | {_short(to_target(long_res, a, 'flops'))} | "
                     f"{_short(gap(long_res, a, 'baseline'))} | "
                     f"{_short(gap(long_res, a, 'frontier'))} | {_short(gap(tut_res, a, 'baseline'))} | "
                     f"{_short(tut_front(a))} | {gpu_cell.get(a, 'not measured')} |")
    return "\n".join(lines)


def _token_ratio(res: dict, arm: str) -> float:
    """Tokens an arm read over the baseline's, from the experiment's regime record."""
    return round(res["regime"][arm]["tokens"] / res["regime"]["baseline"]["tokens"], 3)


def tutorial_table(flops_res: dict, steps_res: dict, timing: dict, gpu: dict | None = None) -> str:
    """The README's table of the tutorial comparison, made from the cache (a test checks the README holds
    exactly this): per arm, what its paper claims, the paper's protocol (equal steps) and equal FLOPs, each gap
    paired by seed with its 95% interval and verdict (`accellib.analysis.stats`), beside the dense frontier; step
    time from the paired timing (`results/tutorial_timing.json`); the GPU column from `gpu`, a record of the
    reworked GPU check (`gpu_cells`; "not measured" without one, and for the arms it does not time)."""
    short = lambda p: "—" if p is None else (f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}] "
                                             f"{p.verdict.replace('not resolved at', 'n.r. at')}")
    steps_rows = {r["arm"]: r for r in steps_res["summary"]["rows"]}
    picks = set(flops_res["summary"].get("frontier", {}).get("per_seed", {}).values())
    gpu_cell = gpu_cells(gpu)
    if gpu_record(gpu):
        gpu_cell["baseline"] = "—"                  # the control the techniques' speed-ups are against
    front = lambda a: "— (the frontier itself)" if picks == {a} else short(gap(flops_res, a, "frontier"))   # no self-row
    lines = [f"| arm | paper's claim | equal steps ({steps_res['summary']['seeds']} seeds): val loss | vs baseline | "
             f"equal FLOPs ({flops_res['summary']['seeds']} seeds): steps | val loss | vs baseline | "
             f"vs dense frontier | CPU step time vs baseline (paired) | {gpu_heading(gpu)} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in flops_res["summary"]["rows"]:
        a, s = r["arm"], steps_rows.get(r["arm"])
        st = (f"{s['val_loss']:.3f} ± {s['val_loss_sd']:.3f}", short(gap(steps_res, a, "baseline"))) if s else ("—", "—")
        if s and "regime" in steps_res and (more := _token_ratio(steps_res, a)) != 1.0:
            st = (st[0], f"{st[1]} (reads {more:.2f}x the baseline's tokens)")   # e.g. the V-cycle's stages
        t = f"{timing[a]:.2f}x" if a in timing else "—"
        claim = PAPER_CLAIMS.get(a, "the control" if a == "baseline" or a.startswith("dense-L") else "not claimed")
        lines.append(f"| {a} | {claim} | {st[0]} | {st[1]} | {r['steps']:.0f} | {r['val_loss']:.3f} ± {r['val_loss_sd']:.3f} | "
                     f"{short(gap(flops_res, a, 'baseline'))} | {front(a)} | {t} | "
                     f"{gpu_cell.get(a, 'not measured')} |")
    return "\n".join(lines)


GPU_CHECK = "benchmarks/gpu_check.py (issue 42)"    # benchmarks/gpu/targets.py's CHECK (a test keeps them equal)
# the point of the GPU check that stands for each technique in the findings tables (the V-cycle has its stages only)
GPU_POINTS = {"pld": "pld@0.5", "sbld": "sbld@0.5", "random_ltd": "random_ltd@1/2", "multilevel": None}


def gpu_record(rec: dict | None) -> bool:
    """Whether `rec` is a finished GPU record of the reworked check (a smoke record, or the old check's, is not)."""
    return bool(rec) and not rec.get("smoke") and rec.get("check") == GPU_CHECK and bool(rec.get("finished"))


def gpu_heading(rec: dict | None) -> str:
    """The findings tables' GPU column heading: what its cells (`gpu_cells`) hold, when they come from a record."""
    return "GPU: realized speed-up; predicted run time" if gpu_record(rec) else "GPU"


def gpu_cells(rec: dict | None) -> dict[str, str]:
    """The findings tables' GPU cell per technique from a record of the reworked GPU check (issue 42), as the heading
    `gpu_heading` says: the realized speed-up in steady state at its point of GPU_POINTS ('1.02 at 0.5'), then the
    predicted whole-run time change of its full-scale config ('-22%'; which config: `gpu_predict_table`), "—" for
    either the record lacks. "not measured" without a GPU record of this check."""
    cells = {a: "not measured" for a in GPU_POINTS}
    if not gpu_record(rec):
        return cells
    parts = rec.get("parts") or {}
    pred = (parts.get("predict") or {}).get("configs") or {}
    for arm, key in GPU_POINTS.items():
        point = parts.get(f"point:{key}") or {}
        real = (point.get("vs_baseline") or {}).get("realized") if point.get("status") == "done" else None
        saving = (pred.get(arm) or {}).get("time_saving")
        if real is not None or saving is not None:
            at = "—" if real is None else f"{real:.2f} at {key.split('@')[1]}"
            cells[arm] = f"{at}; {'—' if saving is None else f'{-100 * saving:+.0f}%'}"
    return cells


def gpu_table(rec: dict) -> str:
    """docs/full_scale.md's table of one GPU check (`results/gpu_check_<gpu>.json`, benchmarks/gpu_check.py), made
    from the record (a test checks the docs hold exactly this). The reworked check's record (issue 42: `parts`
    with `point:<technique>@<x>`): per point in steady state, mean ms per step, tokens/s and the speed against the
    baseline point, MFU against the data sheet's bf16 peak, peak memory, graphs compiled in the warm-up and in the
    timed steps, synchronizing calls per step, and for the points that save FLOPs the FLOPs saving, the time saving
    and their ratio (the realized speed-up); then the V-cycle's levels. The old check's record (issue 34: `arms`,
    5 + 60 steps of each whole schedule): per arm the same columns less ms per step and sync calls, graphs by half
    of the timed steps."""
    pct = lambda v: "—" if v is None else f"{100 * v:.1f}%"      # noqa: E731
    two = lambda v: "—" if v is None else f"{v:.2f}"            # noqa: E731
    if "arms" in rec:
        return _old_gpu_table(rec, pct, two)
    parts = rec["parts"]
    base = parts["point:baseline"]
    lines = ["| point | ms/step | tokens/s | vs baseline | MFU (data sheet) | peak GB | graphs compiled (warm-up / timed) | "
             "sync calls/step | FLOPs saving | time saving | realized |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [(n.split(":", 1)[1], p) for n, p in parts.items() if n.startswith("point:")]
    vc = parts.get("vcycle") or {}
    rows += [(f"V-cycle level {k} ({lv['model']['n_layer']} x {lv['model']['d_model']})", dict(lv, status="done"))
             for k, lv in sorted((vc.get("levels") or {}).items(), key=lambda kv: int(kv[0]))]
    for name, p in rows:
        if p.get("status") != "done":
            lines.append(f"| {name} | {p.get('status', '—')} | — | — | — | — | — | — | — | — | — |")
            continue
        if (p.get("fp8") or {}).get("fp8_layers"):
            name += f" (FP8 Linears {p['fp8']['fp8_layers']})"
        vs = p.get("vs_baseline") or {}
        sync = (p.get("sync_calls") or {}).get("per_step")
        lines.append(f"| {name} | {1e3 * p['mean_step_s']:.2f} | {p['tok_per_s']:,.0f} | "
                     f"{base['mean_step_s'] / p['mean_step_s']:.2f}x | {pct(p['mfu']['datasheet'])} | "
                     f"{p['peak_mem_gb']:.1f} | {p['graphs']['warmup']} / {p['graphs']['timed']} | "
                     f"{'—' if sync is None else format(sync, '.3g')} | {pct(vs.get('flops_saving') or None)} | "
                     f"{pct(vs.get('time_saving') if vs.get('flops_saving') else None)} | {two(vs.get('realized'))} |")
    return "\n".join(lines)


def _old_gpu_table(rec: dict, pct, two) -> str:
    arms, base = rec["arms"], rec["arms"]["baseline"]["tok_per_s"]
    lines = ["| arm | tokens/s | vs baseline | MFU (data sheet) | peak GB | graphs compiled (1st / 2nd half) | "
             "FLOPs saving | time saving | realized |", "|---|---|---|---|---|---|---|---|---|"]
    for a, r in arms.items():
        if r.get("status") != "done":
            lines.append(f"| {a} | {r.get('status', '—')} | — | — | — | — | — | — | — |")
            continue
        g = r.get("graphs", {})
        graphs = f"{g['first_half']} / {g['second_half']}" if "first_half" in g else f"{g.get('total', '—')} in all"
        rs = r.get("realized_speedup") or {}
        lines.append(f"| {a} | {r['tok_per_s']:,.0f} | {r['tok_per_s'] / base:.2f}x | {pct(r['mfu']['datasheet'])} | "
                     f"{r['peak_mem_gb']:.1f} | {graphs} | {pct(rs.get('flops_saving'))} | {pct(rs.get('time_saving'))} | "
                     f"{two(rs.get('realized'))} |")
    return "\n".join(lines)


def gpu_predict_table(rec: dict) -> str:
    """The reworked GPU check's predicted whole runs (its `predict` part; docs/full_scale.md, a test keeps them
    equal): per full-scale config, its steps and its baseline's, predicted seconds per process of each, the
    FLOPs saving, the time saving and the realized speed-up."""
    lines = ["| technique | config | steps (baseline's) | predicted s (baseline's) | FLOPs saving | time saving | "
             "realized |", "|---|---|---|---|---|---|---|"]
    for t, c in rec["parts"]["predict"]["configs"].items():
        lines.append(f"| {t} | `{c['config'].split('/')[-1]}` | {c['steps']:,} ({c['baseline_steps']:,}) | "
                     f"{c['predicted_s']:,.0f} ({c['baseline_s']:,.0f}) | {100 * c['flops_saving']:.1f}% | "
                     f"{100 * c['time_saving']:.1f}% | {c['realized']:.2f} |")
    return "\n".join(lines)


def gpu_verdicts_table(rec: dict) -> str:
    """The reworked GPU check's targets (its `verdicts`, as the check judged them; docs/full_scale.md, a test keeps
    them equal): what is measured, the value, the target and the verdict (met, missed, or not measured)."""
    cell = lambda x: str(x).replace("|", "\\|")     # noqa: E731  (|x - 1| inside a Markdown cell)
    lines = ["| target | measured | goal | verdict |", "|---|---|---|---|"]
    for v in rec["verdicts"]:
        m = v["measured"]
        m = "not measured" if m is None else (format(m, ".4g") if isinstance(m, (int, float)) else m)
        word = "not measured" if v["passed"] is None else ("met" if v["passed"] else "**missed**")
        lines.append(f"| {cell(v['what'])} | {cell(m)} | {cell(v['target'])} | {word} |")
    return "\n".join(lines)


def run_where(res: dict) -> str:
    """Where a cached experiment ran, for the notebooks' provenance lines: its GPU when it had one, else the CPU, its
    parallel runs and the threads of each. Every run that benchmarks/reproduce.py starts gets --train.threads=1 (since
    commit bae6093, older than every cache; new records say so in `threads_per_run`): `environment.torch_threads` is
    the count of the process that wrote the record, not of a run."""
    env = res["environment"]
    if env.get("gpu"):
        return env["gpu"]
    threads = res.get("threads_per_run", 1 if "reproduce.py" in res.get("command", "") else env["torch_threads"])
    runs = "one run at a time" if res["jobs"] == 1 else f"{res['jobs']} runs in parallel"
    return f"CPU, {runs} on a shared machine, {threads} thread{'' if threads == 1 else 's'} each"
