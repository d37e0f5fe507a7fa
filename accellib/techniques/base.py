"""The Technique base class: the hook points a technique plugs into, all no-ops here.

The hook points a technique plugs into. Every hook is a no-op here; a technique overrides
the ones it needs. The trainer calls them in this order:

    Technique(cfg, run_cfg)                 build from its config section
    ddp_kwargs()                            -> DistributedDataParallelKwargs fields it needs
    setup(trainer)                          after accelerator.prepare (profile, swap lr schedule, ...)
    per optimizer step, per micro-batch:
        update_plan(plan, step, micro_step)   fill the Plan in place (block gates, scales, kept tokens)
        extra_loss(model, x, y, logits)        -> extra loss term or None
                                               (logits: the task's output; an mlm's are (B, k, V), its k masked positions)
    run_step(trainer, batches, plans)       -> list of micro-batch losses, or None for the standard
                                               forward/backward loop (layered accumulation overrides it)
    lr_factor(state)                        multiplies the LR schedule's value
    step_end(trainer)                       after the optimizer step
    metrics(state)                          extra fields for metrics.jsonl
    should_stop(state)                      end training early (e.g. a LayerToken budget)
    state_dict() / load_state_dict(d)       registered with Accelerate's save_state/load_state
    fsdp_refusal()                          why it cannot run when FSDP shards the model ("" = it can)
    preview()                               instead of setup(), when plans are drawn without training
                                            (compare's FLOPs and timing budgets, accellib/drivers/budget.py)

`plan_fields` names the BlockPlan fields a technique writes ("run", "scale", "keep"); two enabled
techniques that write the same field cannot compose and the trainer says so.
"""
from __future__ import annotations

from typing import Any, Optional

from ..core.options import ConfigError


class Technique:
    name: str = ""
    Config: type = object
    plan_fields: tuple[str, ...] = ()
    incompatible: tuple[str, ...] = ()   # other technique names it cannot run with
    kinds: tuple[str, ...] = ("gpt", "mlm")   # the model.kind values it applies to
    needs: str = "a language model"           # what it needs of the model, for the refusal's message

    def __init__(self, cfg: Any, run_cfg: Any):
        self.cfg = cfg
        self.run_cfg = run_cfg

    def ddp_kwargs(self) -> dict:
        return {}

    def setup(self, trainer: Any) -> None:
        pass

    def update_plan(self, plan: Any, step: int, micro_step: int) -> None:
        pass

    def preview(self) -> None:
        """Get ready to draw plans (and take steps) without training: replace whatever setup() would
        learn from the model by a stand-in with the same compute (see accellib/drivers/budget.py)."""

    def extra_loss(self, model: Any, x: Any, y: Any, logits: Any) -> Optional[Any]:
        return None

    def run_step(self, trainer: Any, batches: list, plans: list) -> Optional[list]:
        return None

    def lr_factor(self, state: Any) -> float:
        return 1.0

    def step_end(self, trainer: Any) -> None:
        pass

    def extra_flops(self, step: int, task: Any) -> float:
        """FLOPs (one process's) this technique spends outside the step's plans at the end of optimizer step
        `step` (e.g. SBLD's profiling forwards): charged to the run's FLOPs by the trainer, and counted by the
        equal-FLOPs planner (drivers/budget.planned_flops), so a budget and a time-to-target both pay them."""
        return 0.0

    def metrics(self, state: Any) -> dict:
        return {}

    def should_stop(self, state: Any) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass

    def fsdp_refusal(self) -> str:
        """Why this technique cannot run under an FSDP launch, as the end of a sentence; "" when it can. A
        technique that only fills the plan or adds a loss term runs under FSDP: it calls the model's forward,
        whose blocks are the FSDP units, and never reads a parameter outside it."""
        return ""


def check_fsdp(techniques: list[Technique], kind: str) -> None:
    """Raise a one-line ConfigError when the run cannot be trained under an FSDP launch (accellib.core.launch.fsdp_plugin):
    a model without transformer blocks (the FSDP units), or a technique that cannot run sharded (fsdp_refusal)."""
    if kind not in ("gpt", "mlm", "vit"):
        raise ConfigError(f"an FSDP launch shards one unit per transformer block, and model.kind={kind} has none; "
                          "launch it data-parallel (accelerate launch --multi_gpu)")
    for t in techniques:
        why = t.fsdp_refusal()
        if why:
            raise ConfigError(f"{t.name} cannot run under an FSDP launch: {why}; launch it data-parallel "
                              f"(accelerate launch --multi_gpu) or disable {t.name}")


def check_applicable(techniques: list[Technique], kind: str) -> None:
    """Raise a one-line ConfigError if an enabled technique does not apply to model.kind."""
    for t in techniques:
        if kind not in t.kinds:
            raise ConfigError(f"{t.name} does not apply to model.kind={kind}: it needs {t.needs} "
                              f"(model.kind {' or '.join(t.kinds)}); disable it or change the model")


def check_composition(techniques: list[Technique]) -> None:
    """Raise a one-line ConfigError if two enabled techniques cannot run together."""
    names = {t.name for t in techniques}
    engines = [t.name for t in techniques if getattr(t, "splits_model", False)]
    if engines and len(techniques) > 1:
        other = next(t.name for t in techniques if t.name != engines[0])
        raise ConfigError(f"{engines[0]} splits the plain model across processes and cannot be combined with "
                          f"{other}; enable only one of them")
    for t in techniques:
        bad = names & set(t.incompatible)
        if bad:
            raise ConfigError(f"{t.name} cannot be combined with {sorted(bad)[0]}; enable only one of them")
    for i, a in enumerate(techniques):
        for b in techniques[i + 1:]:
            shared = set(a.plan_fields) & set(b.plan_fields)
            if shared:
                raise ConfigError(f"{a.name} and {b.name} both decide the plan's '{sorted(shared)[0]}' "
                                 f"for each block; enable only one of them")
    if sum(type(t).run_step is not Technique.run_step for t in techniques) > 1:
        raise ConfigError("two enabled techniques both replace the step's forward/backward loop; "
                         "enable only one of them")
