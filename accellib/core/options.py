"""Declaring a config field (`opt`) and the one-line `ConfigError`.

The leaf that core/config.py and every technique's `Config` dataclass import, so techniques never import the run
configuration itself (config.py reads the technique registry)."""
from __future__ import annotations

from dataclasses import field
from typing import Any, Optional


class ConfigError(ValueError):
    """A bad config key or value; the message is one line saying what to change."""


def opt(default: Any, help: str = "", *, min: Any = None, max: Any = None, below: Any = None,
        choices: Optional[list] = None, horizon: Optional[str] = None, resume: bool = False):
    """A dataclass field with help text and the allowed range/choices (`below`: a strict upper bound).
    `horizon` marks a schedule length that follows the run's length (see `with_horizon`): "steps" (a
    number of optimizer steps, 0 = automatic) or "rate" (a per-step decay rate). `resume=True`: a
    `--resume` may change it (cadences, logging, the machine, the optimizer's numbers, the length);
    every other field is fixed for the run's life (accellib/train.py, resume_config)."""
    meta = dict(help=help, min=min, max=max, below=below, choices=choices, horizon=horizon, resume=resume)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
