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
from .stats import Paired



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
    txt = {r["arm"]: [gap(res, r["arm"], c).text() if f"vs_{c}" in r else "-" for c in ("baseline", "frontier")]
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


# What each paper reports for its own setting (the sources in shared/seeds and each notebook's header), beside our
# tutorial-scale measurements in the README's findings table
PAPER_CLAIMS = {
    "pld": "BERT: −25% FLOPs, −24% wall time (Zhang & He 2020)",
    "sbld": "GPT-3 Medium: −19.7% training time (Zeng et al. 2023)",
    "random_ltd": "GPT-3 1.3B: −33% compute, −26% wall time, same zero-shot (Yao et al. 2022)",
    "multilevel": "BERT/GPT-Base: −20% compute; BERT-Large −52% (Zou et al. 2024)",
}


def findings_table(flops_res: dict, steps_res: dict, timing: dict) -> str:
    """The README's table of the tutorial comparison, made from the cache (a test checks the README holds
    exactly this): per arm, what its paper claims, the paper's protocol (equal steps) and equal FLOPs, each gap
    paired by seed with its 95% interval and verdict (`accellib.analysis.stats`), beside the dense frontier; step
    time from the paired timing (`results/tutorial_timing.json`); the GPU column says "not measured" until a GPU
    run exists."""
    short = lambda p: "—" if p is None else (f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}] "
                                             f"{p.verdict.replace('not resolved at', 'n.r. at')}")
    steps_rows = {r["arm"]: r for r in steps_res["summary"]["rows"]}
    lines = [f"| arm | paper's claim | equal steps ({steps_res['summary']['seeds']} seeds): val loss | vs baseline | "
             f"equal FLOPs ({flops_res['summary']['seeds']} seeds): steps | val loss | vs baseline | "
             "vs dense frontier | CPU step time vs baseline (paired) | GPU |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in flops_res["summary"]["rows"]:
        a, s = r["arm"], steps_rows.get(r["arm"])
        st = (f"{s['val_loss']:.3f} ± {s['val_loss_sd']:.3f}", short(gap(steps_res, a, "baseline"))) if s else ("—", "—")
        t = f"{timing[a]:.2f}x" if a in timing else "—"
        claim = PAPER_CLAIMS.get(a, "the control" if a == "baseline" or a.startswith("dense-L") else "not claimed")
        lines.append(f"| {a} | {claim} | {st[0]} | {st[1]} | {r['steps']:.0f} | {r['val_loss']:.3f} ± {r['val_loss_sd']:.3f} | "
                     f"{short(gap(flops_res, a, 'baseline'))} | {short(gap(flops_res, a, 'frontier'))} | {t} | not measured |")
    return "\n".join(lines)
