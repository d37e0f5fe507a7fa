"""One figure style for every notebook and run: small PNGs, colour-blind-safe colours."""
from __future__ import annotations

from pathlib import Path

import matplotlib

# Okabe-Ito palette (colour-blind safe)
COLORS = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442"]

X_LABELS = dict(step="optimizer step", flops="training FLOPs (analytic)", wall="wall time (s)",
                tokens="tokens seen", layer_tokens="layer-tokens")


def set_style() -> None:
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.figsize": (5, 3), "figure.dpi": 90, "savefig.dpi": 110,
                         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "font.size": 9,
                         "axes.prop_cycle": matplotlib.cycler(color=COLORS)})


def plot_val_curves(runs: dict[str, list[dict]], xs=("flops", "wall"), ax=None, title=None):
    """Validation loss of several runs against each x in `xs`, one panel per x.
    `runs` maps a label to its metrics.jsonl records."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(xs), figsize=(5 * len(xs), 3), squeeze=False)
    for ax, x in zip(axes[0], xs):
        for label, recs in runs.items():
            pts = [(r[x], r["val_loss"]) for r in recs if "val_loss" in r]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=label)
        ax.set_xlabel(X_LABELS.get(x, x))
        ax.set_ylabel("validation loss (nats/token)")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_fig(fig, path: str | Path) -> None:
    import matplotlib.pyplot as plt
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
