"""Hook-point techniques, one module each, and their registry: config section name -> Technique class.

Only techniques that plug into the one Trainer's hook points belong here (what builds several Trainers is
drivers/). Each technique module (in accellib/techniques/ or accellib/parallel/) defines a `Technique`
subclass with a `Config` dataclass (whose `enabled` field switches it on) and decorates it with
`@register`; the modules are imported below, so every section appears in configs and `--help`.
"""
from __future__ import annotations

from .base import Technique, check_applicable, check_composition, check_fsdp

REGISTRY: dict[str, type[Technique]] = {}


def register(cls: type[Technique]) -> type[Technique]:
    REGISTRY[cls.name] = cls
    return cls


def build_techniques(run_cfg) -> list[Technique]:
    """Instantiate the enabled techniques of a RunConfig, in registry order."""
    out = [REGISTRY[n](run_cfg.techniques[n], run_cfg) for n in REGISTRY
           if getattr(run_cfg.techniques.get(n), "enabled", False)]
    check_applicable(out, run_cfg.model.kind)
    check_composition(out)
    return out


def _discover() -> None:
    import importlib
    import pkgutil
    for pkg in ("accellib.techniques", "accellib.parallel"):
        mod = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(mod.__path__):
            if info.name != "base" and not info.name.startswith("_"):
                importlib.import_module(f"{pkg}.{info.name}")


_discover()
