"""Learning-rate schedules keyed by our own optimizer-step counter.

Learning-rate schedules keyed by our own optimizer-step counter (never a prepared LR
scheduler: Accelerate steps those once per process and on skipped accumulation steps)."""
from __future__ import annotations

import math


class WarmupCosine:
    """Linear warm-up to `lr` over `warmup` steps, then cosine decay to `lr * min_ratio` at `total`.

        lr(t) = lr * (t + 1) / warmup                                   t < warmup
        lr(t) = lr * (m + (1 - m) * (1 + cos(pi * s)) / 2),  s = (t - warmup) / (total - warmup)
    """

    def __init__(self, lr: float, warmup: int, total: int, min_ratio: float = 0.1):
        self.lr, self.warmup, self.total, self.min_ratio = lr, warmup, total, min_ratio

    def at(self, step: float) -> float:
        if step < self.warmup:  # min(): a fractional step (LayerTokenLR) must not overshoot the peak
            return min(self.lr, self.lr * (step + 1) / self.warmup)
        s = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * s)))

    def __call__(self, state) -> float:
        return self.at(state.step)
