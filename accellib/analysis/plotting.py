"""One figure style for every notebook and run.

One figure style for every notebook and run: small PNGs, colour-blind-safe colours, one colour per
arm in every figure, and the unigram/bigram reference losses on every language-model loss plot."""
from __future__ import annotations

import re
import zlib
from pathlib import Path

import matplotlib

# Okabe-Ito palette (colour-blind safe): the first colours of the registry below
COLORS = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442"]

# The course's one colour registry: every arm, and every other named series a notebook draws (number
# formats, accumulation orders, normalisations), has one colour here, the same in every notebook and in
# compare.png, and no two names share one (tests/test_plotting.py). A variant of an arm, written
# 'arm@setting' or 'arm setting' (e.g. 'pld 0.7', 'ouroboros_k2@lr3.5e-3'), takes its arm's colour: its panel or
# line style tells it apart. Register a new arm here before a notebook draws it.
ARM_COLORS = {
    # the tutorial's arms (notebooks 00-04, 09)
    "baseline": "#000000", "pld": "#E69F00", "sbld": "#56B4E9", "random_ltd": "#009E73",
    "multilevel": "#D55E00", "pld+random_ltd": "#0072B2", "sbld+random_ltd": "#CC79A7", "control": "#777777",
    # plain models of other depths at the same budget (the dense frontier): greys, light = shallow, dashed
    "dense-L1": "#c4c4c4", "dense-L2": "#a8a8a8", "dense-L3": "#8c8c8c", "dense-L4": "#5e5e5e", "dense-L5": "#3f3f3f",
    "dense-L6": "#262626", "dense-L9": "#1a1a1a", "dense-L12": "#0d0d0d", "dense-L16": "#050505",
    "dense-L24": "#020202",
    # plain models of other widths (the frontier bracketed in width): blue-greys, light = narrow
    "dense-L1-d8": "#eef2f6", "dense-L1-d16": "#e3e9ef", "dense-L1-d64": "#a3b1bf", "dense-L1-d96": "#7d8c9b",
    "dense-L1-d128": "#66778a",   # the IsoFLOP grid's one-block widths (results/isoflop.json)
    "dense-L1-d32": "#d5dde5", "dense-L1-d48": "#b3c0cc", "dense-L2-d48": "#8d9cab", "dense-L6-d32": "#4a5866",
    "dense-L6-d24": "#6b7a89", "dense-L12-d24": "#3a4651", "dense-L12-d32": "#2a333c",   # results/ot_profile.json
    # engines that split the model (notebooks 05, 06)
    "pipeline": "#8c564b", "ouroboros_k2": "#bcbd22", "ouroboros_k3": "#17becf", "ouroboros_k4": "#e377c2",
    # notebook 05: layered gradient accumulation (the 'standard' order is the baseline's) and the planner's
    # 'improved' method (layered accumulation + modular pipeline; its 'baseline' method is the baseline's colour)
    "layered": "#9467bd", "improved": "#1f77b4",
    # low-precision arms (notebook 07): FP8 operands with several accumulators; the mantissa sweep
    "fp8_fp32acc": "#7b3294", "fp8_naive": "#b2182b", "fp8_chunk64": "#2166ac", "fp8_chunk64_rne": "#67a9cf",
    "acc_m6_naive": "#fdb863", "acc_m4_naive": "#e08214", "acc_m2_naive": "#8c510a",
    "acc_m4_chunk32": "#5ab4ac", "acc_m2_chunk32": "#01665e",
    # number formats (notebook 07)
    "e6m9": "#4d9221", "fp16": "#c51b7d", "bf16": "#a6761d", "e5m2": "#2ca02c", "e4m3": "#ff7f0e",
    # normalisation arms (notebook 08): SL = standardization loss; BN, LN = batch, layer norm
    "sl": "#d6604d", "bn": "#4393c3", "ln": "#542788", "noln": "#b8e186", "noln_sl": "#f4a582",
    # the image configs' other normalisation arms (configs/mnist_cnn.yaml, cifar10_vit_sl.yaml)
    "mlp": "#7f7f7f", "mlp_bn": "#9ecae1", "mlp_sl": "#fc9272", "no_norm": "#c7e9c0", "no_norm_sl": "#fdd0a2",
}
REFERENCE_STYLE = {"unigram": ":", "bigram": "--"}

X_LABELS = dict(step="optimizer step", flops="training FLOPs (analytic)", wall="wall time (s)",
                tokens="tokens seen", layer_tokens="layer-tokens")


def arm_family(label: str) -> str:
    """The registered arm a label draws as: its name before any '/seed...' and then before any '@' or ' '."""
    name = label.split("/")[0]
    if re.fullmatch(r"lr[0-9.e-]+(_wu\d+)?", name):   # an LR sweep or check (notebook 00): the baseline at other settings
        return "baseline"
    if m := re.fullmatch(r"lrx[0-9.]+-(L\d+-d\d+)", name):   # the IsoFLOP LR check: that plain model at another LR
        return f"dense-{m.group(1)}"
    return name if name in ARM_COLORS else name.split("@")[0].split(" ")[0]


def arm_color(label: str) -> str:
    """The colour of an arm (see ARM_COLORS); an arm no notebook draws (a user's own) gets a stable colour
    from its name, outside the registry's."""
    fam = arm_family(label)
    if fam in ARM_COLORS:
        return ARM_COLORS[fam]
    # zlib.crc32, not hash(): str hashes change with every process, and a colour must not
    return _SPARE[zlib.crc32(fam.encode()) % len(_SPARE)]


# colours no registered arm uses, for arms outside the course
_SPARE = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5"]


def arm_linestyle(label: str) -> str:
    """Dashed for the plain models of other sizes (dense-L<n>), solid for every other arm."""
    return "--" if label.split("/")[0].startswith("dense-L") else "-"


def set_style() -> None:
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.figsize": (5, 3), "figure.dpi": 90, "savefig.dpi": 110,
                         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "font.size": 9,
                         "axes.prop_cycle": matplotlib.cycler(color=COLORS)})


def draw_references(ax, references: dict[str, float] | None) -> None:
    """Horizontal lines at the unigram / bigram validation losses (`data.ngram_references`)."""
    for name, v in (references or {}).items():
        ax.axhline(v, color="#999999", lw=1, ls=REFERENCE_STYLE.get(name, "-."), label=f"{name} model", zorder=0)


def _unit(runs: dict[str, list[dict]]) -> str:
    """What a loss is averaged over: images for an image task (its records carry val_acc), else tokens."""
    return "image" if any("val_acc" in r for recs in runs.values() for r in recs) else "token"


def plot_val_curves(runs: dict[str, list[dict]], xs=("flops", "wall"), title=None, references=None):
    """Validation loss of several runs against each x in `xs`, one panel per x. `runs` maps a label to
    its metrics.jsonl records; labels 'arm/seed<k>' draw every seed of an arm in the arm's colour,
    with one legend entry per arm."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(xs), figsize=(5 * len(xs), 3), squeeze=False)
    for ax, x in zip(axes[0], xs):
        seen = set()
        for label, recs in runs.items():
            pts = [(r[x], r["val_loss"]) for r in recs if "val_loss" in r]
            arm = label.split("/")[0]
            if pts:
                ax.plot(*zip(*pts), marker=".", color=arm_color(label), alpha=0.8 if "/" in label else 1.0,
                        label=None if arm in seen else arm)
                seen.add(arm)
        draw_references(ax, references)
        ax.set_xlabel(X_LABELS.get(x, x))
        ax.set_ylabel(f"validation loss (nats/{_unit(runs)})")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_training(runs: dict[str, list[dict]], references=None, title=None):
    """The three panels a reader checks first, against the optimizer step: training loss (mean of each
    log window) with the validation points, the largest pre-clip gradient norm of each window (a spike
    shows here first), and the learning rate."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 3))
    for label, recs in runs.items():
        c = arm_color(label)
        tr = [r for r in recs if r.get("train_loss") is not None]
        axes[0].plot([r["step"] for r in tr], [r["train_loss"] for r in tr], color=c, lw=1, label=f"{label} train")
        ev = [r for r in recs if "val_loss" in r]
        axes[0].plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o", ms=3, color=c, label=f"{label} val")
        axes[1].plot([r["step"] for r in tr], [r.get("grad_norm", float("nan")) for r in tr], color=c, lw=1, label=label)
        axes[2].plot([r["step"] for r in tr], [r["lr"] for r in tr], color=c, lw=1, label=label)
    draw_references(axes[0], references)
    axes[0].set_ylabel(f"loss (nats/{_unit(runs)})")
    axes[1].set_ylabel("max grad-norm per log window")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("learning rate")
    for ax in axes:
        ax.set_xlabel("optimizer step")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_fig(fig, path: str | Path) -> None:
    import matplotlib.pyplot as plt
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_gaps_by_length(points: dict[str, list[dict]], families: dict[str, str] | None = None, title=None):
    """Each technique's same-size gap at equal FLOPs (mean and 95% interval, paired by seed) against its baseline's
    tokens per parameter (log axis), one panel per technique: does the gap shrink, cross zero or grow as the model
    is trained longer? `points` is `analysis.regime.gaps_by_length`'s; `families` = {experiment: label} marks which
    points share a model family (width, heads, LR rule), drawn with one marker each and joined by a line."""
    import matplotlib.pyplot as plt
    arms = [a for a, v in points.items() if v]
    fig, axes = plt.subplots(1, len(arms), figsize=(2.6 * len(arms), 2.8), sharey=True, squeeze=False)
    fams = families or {}
    marks = dict(zip(dict.fromkeys(fams.values()), "osD^v"))
    for ax, arm in zip(axes[0], arms):
        for fam in dict.fromkeys(fams.get(p["experiment"], p["experiment"]) for p in points[arm]):
            pts = [p for p in points[arm] if fams.get(p["experiment"], p["experiment"]) == fam]
            x = [p["tokens_per_param"] for p in pts]
            y = [p["gap"]["mean"] for p in pts]
            err = [[p["gap"]["mean"] - p["gap"]["lo"] for p in pts], [p["gap"]["hi"] - p["gap"]["mean"] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker=marks.get(fam, "o"), color=arm_color(arm), capsize=3, lw=1,
                        label=fam, ls="-" if len(pts) > 1 else "none")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(1, 3000)
        ax.set_xticks([1, 10, 100, 1000], ["1", "10", "100", "1000"])
        ax.minorticks_off()
        ax.set_title(arm, fontsize=9)
        ax.set_xlabel("tokens per parameter")
    axes[0][0].set_ylabel("gap to same-size baseline (nats)\n< 0: the technique is better")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
