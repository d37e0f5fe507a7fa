"""One figure style for every notebook and run: small PNGs, colour-blind-safe colours, one colour per
arm in every figure, and the unigram/bigram reference losses on every language-model loss plot."""
from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

# Okabe-Ito palette (colour-blind safe)
COLORS = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442"]

# the same arm has the same colour in every notebook and in compare.png
ARM_COLORS = {"baseline": COLORS[0], "pld": COLORS[1], "sbld": COLORS[2], "random_ltd": COLORS[3],
              "multilevel": COLORS[4], "pld+random_ltd": COLORS[5], "sbld+random_ltd": COLORS[6],
              "control": "#777777",
              # engines that split the model (notebooks 05, 06): shades that stay clear of the baseline's black
              "pipeline": "#8c564b", "ouroboros_k2": "#bcbd22", "ouroboros_k3": "#17becf", "ouroboros_k4": "#e377c2",
              "ouroboros": "#17becf",
              # plain models of other depths at the same budget (the dense frontier): greys, light = shallow,
              # drawn dashed (`arm_linestyle`)
              "dense-L1": "#c4c4c4", "dense-L2": "#a8a8a8", "dense-L3": "#8c8c8c", "dense-L4": "#5e5e5e",
              "dense-L5": "#3f3f3f"}
REFERENCE_STYLE = {"unigram": ":", "bigram": "--"}

X_LABELS = dict(step="optimizer step", flops="training FLOPs (analytic)", wall="wall time (s)",
                tokens="tokens seen", layer_tokens="layer-tokens")


def arm_color(label: str) -> str:
    """The colour of an arm: its name before any '/seed...' or ' ' suffix (e.g. 'pld 0.7' is PLD's)."""
    name = label.split("/")[0]
    if name in ARM_COLORS:
        return ARM_COLORS[name]
    base = name.split(" ")[0]
    # zlib.crc32, not hash(): str hashes change with every process, and a colour must not
    return ARM_COLORS.get(base, COLORS[zlib.crc32(base.encode()) % len(COLORS)])


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
