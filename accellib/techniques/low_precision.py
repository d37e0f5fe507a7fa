"""The `lowp` technique: FP8 GEMM operands, narrow chunk-based accumulation, a stochastically rounded update.

Low-precision training numerics: FP8 GEMM operands, chunk-based narrow accumulation, and a
stochastically rounded 16-bit weight update with no fp32 master copy. Wang et al., "Training Deep
Neural Networks with 8-bit Floating Point Numbers", NeurIPS 2018 (arXiv 1812.08011). Only the
abstract was retrieved: the kept first/last layers, loss scaling and chunk length 64 are as commonly
reported, not checked against the paper.

    python -m accellib.train --config configs/tutorial.yaml --out runs/fp8 --lowp.enabled=true --lowp.chunk=64

backend=emulate (any CPU or GPU) switches every nn.Linear of the model, except the first and the
last when keep_first_last, to `accellib.numerics.EmulatedLinear`: operands rounded to `operand`,
each of its three GEMMs accumulated in `acc` with its own chunk length. After every optimizer step
the emulated layers' weights and AdamW moments are rounded to `weights` with `update` rounding:
the fp32 values the optimizer computes exist only inside the step, as in Wang et al.'s update
W <- SR(W - lr * u). Attention's score and value products, LayerNorm, softmax and the loss stay fp32.

The random draws of stochastic rounding come from (seed, step): a resumed run rounds exactly as the
uninterrupted one, and every data-parallel process rounds its replica identically.

backend=torchao runs real FP8 GEMMs through `torchao.float8.convert_to_float8_training` (H100-class
GPU; torchao's recipe `fp8_recipe`: tensorwise- or rowwise-scaled FP8 operands, fp32 accumulation with the
GPU's periodic promotion, fp32 master weights), so operand/acc/chunk/weights/keep_first_last do not apply
to it. Which Linears convert is decided by a measured table, never by default: torchao's float8 README
(pytorch/ao, torchao/float8/README.md, "Performance") gives H100 microbenchmark tables of FP8 over bf16
speed-up by the forward GEMM's (M, K, N), one per recipe (tensorwise, rowwise, rowwise_with_gw_hp), and
explains them: FP8 pays its amax and cast kernels on every call and wins only where the GEMM's own saving
is larger, so small shapes lose (its example: (M, K, N) = (1024, 2048, 1024) at 0.80x, stay bf16) and large
ones gain ((4096, 8192, 16384) at 1.39x). GPT-2 small has K, N <= 3072 in its blocks, so this GPU's own
table (benchmarks/fp8_table.py: bf16 vs each recipe, compiled forward + backward, per Linear shape)
decides: a Linear, the vocabulary head included, converts only where its shape (nearest measured M = the
run's tokens per micro-batch, the same K and N) reached `fp8_min_speedup` with `fp8_recipe`. With no
table for this GPU nothing converts and setup says, in one line, how to make one; with a table where no
shape gains it says which shapes and their speed-ups, and converts nothing (fp8_plan, a pure function).
"""
from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..core.options import ConfigError, opt
from ..data.tokens import seed_for
from ..numerics.formats import parse_format, quantize
from ..numerics.linear import LowpGemms, convert
from . import register
from .base import Technique

ACC_STREAM, UPDATE_STREAM = 0x10, 0x11   # tags of the two random streams per step
FP8_RECIPES = ("tensorwise", "rowwise")
TABLE_CMD = "python benchmarks/fp8_table.py"
RESULTS = Path(__file__).resolve().parents[2] / "results"


@dataclass
class LowpConfig:
    enabled: bool = opt(False, "low-precision GEMMs and weight update (Wang et al. 2018)")
    backend: str = opt("emulate", "emulate = exact emulation on any device (accellib.numerics); torchao = real "
                       "FP8 GEMMs via torchao.float8 (CUDA GPU with FP8 tensor cores)", choices=["emulate", "torchao"])
    operand: str = opt("e5m2", "format of every GEMM operand: weights, activations, errors (paper: FP8 (1,5,2)); "
                       "e5m2, e4m3, fp16, bf16, fp32 or eXmY")
    acc: str = opt("e6m9", "accumulator format of every GEMM (paper: FP16 (1,6,9)); fp32 = wide accumulation")
    chunk: int = opt(64, "chunk length CL of the accumulations; 0 = naive (one running sum)", min=0)
    chunk_fwd: int = opt(-1, "CL of the forward GEMM (K = d_in); -1 = chunk", min=-1)
    chunk_bgrad: int = opt(-1, "CL of the input-gradient GEMM (K = d_out); -1 = chunk", min=-1)
    chunk_wgrad: int = opt(-1, "CL of the weight-gradient GEMM (K = tokens per micro-batch); -1 = chunk", min=-1)
    outer: str = opt("", "format of the second accumulator that sums the chunk sums; '' = acc")
    acc_rounding: str = opt("nearest", "rounding after every accumulator add", choices=["nearest", "stochastic"])
    keep_first_last: bool = opt(True, "keep the first and the last Linear layer at fp32 (as the paper is reported to)")
    loss_scale: float = opt(1024.0, "power of two the errors are multiplied by before FP8 rounding (loss "
                            "scaling); 1 = none", min=1.0)
    weights: str = opt("e6m9", "storage format of the emulated layers' weights and AdamW moments (paper: "
                       "FP16 (1,6,9), no fp32 master copy); fp32 = keep an fp32 master copy")
    update: str = opt("stochastic", "rounding of the weight update into `weights`", choices=["nearest", "stochastic"])
    fp8_recipe: str = opt("tensorwise", "backend=torchao: torchao's scaling recipe (its README: tensorwise the "
                          "fastest, rowwise better with outliers)", choices=list(FP8_RECIPES))
    fp8_table: str = opt("", "backend=torchao: the measured per-shape table that decides which Linears convert; "
                         f"'' = results/fp8_table_<gpu>.json for this GPU (made by: {TABLE_CMD})")
    fp8_min_speedup: float = opt(1.0, "backend=torchao: a Linear converts only if its shape's measured FP8 speed-up "
                                 "over bf16 reaches this", min=0.0)


# ------------------------------------------------------------------ backend=torchao: which Linears convert
def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3': the GPU's part of a table's file name (as gpu_check's)."""
    s = name.lower().removeprefix("nvidia").strip()
    return "".join(ch if ch.isalnum() else "_" for ch in s).strip("_") or "cuda"


def table_path(gpu_name: str) -> Path:
    """Where benchmarks/fp8_table.py writes, and setup looks for, the table of the GPU named `gpu_name`."""
    return RESULTS / f"fp8_table_{gpu_slug(gpu_name)}.json"


def read_table(path: str | Path) -> list[dict]:
    """The rows of a table benchmarks/fp8_table.py wrote: each {"name", "shape": [M, K, N], "speedup": {recipe:
    bf16 time / FP8 time, or None where not measured}, ...}. Anything else: a one-line ConfigError naming the file."""
    def bad(what: str):
        return ConfigError(f"lowp.fp8_table: {path}: {what} (remake it with: {TABLE_CMD})")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise bad(f"unreadable ({type(e).__name__})") from None
    except json.JSONDecodeError as e:
        raise bad(f"not JSON ({e.msg} at line {e.lineno})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise bad("no list of measured rows under 'rows'")
    for i, r in enumerate(rows):
        shape = r.get("shape") if isinstance(r, dict) else None
        if not (isinstance(shape, list) and len(shape) == 3 and all(type(v) is int and v > 0 for v in shape)):
            raise bad(f"row {i}: 'shape' is not [M, K, N] of positive integers")
        sp = r.get("speedup")
        if not isinstance(sp, dict):
            raise bad(f"row {i}: 'speedup' is not a mapping recipe -> speed-up")
        for k, v in sp.items():
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      and v > 0):
                raise bad(f"row {i}: speedup[{k!r}] = {v!r} is not a positive number or null")
    return rows


@dataclass
class Fp8Plan:
    convert: list[str]          # the Linears to convert, in the model's order
    reasons: dict[str, str]     # every Linear's why, by name
    line: str                   # what setup prints and the record keeps, one line


def fp8_plan(rows: Optional[list[dict]], linears: list[tuple[str, int, int]], tokens: int, recipe: str,
             min_speedup: float = 1.0, source: str = "the table") -> Fp8Plan:
    """Which of `linears` ((name, in_features K, out_features N) each) convert to FP8: those whose shape the
    table `rows` (read_table; None = no table at `source`) measured at a speed-up >= `min_speedup` with `recipe`,
    at the row of the same K, N whose M is nearest (in ratio) to `tokens`, the Linear's tokens per call."""
    if rows is None:
        why = f"no FP8 table for this GPU ({source})"
        return Fp8Plan([], {n: why for n, _, _ in linears},
                       f"lowp: {why}: no Linear converts (FP8 is never slower than bf16 by default); make the table "
                       f"on this GPU with: {TABLE_CMD}")
    convert, reasons, seen = [], {}, {}
    for name, k, n in linears:
        same = [r for r in rows if r["shape"][1:] == [k, n]]
        if k % 16 or n % 16:
            reasons[name] = f"K={k}, N={n}: torchao's FP8 GEMM needs multiples of 16"
            continue
        if not same:
            reasons[name] = f"(K, N) = ({k}, {n}) is not in the table"
            continue
        r = min(same, key=lambda r: (abs(math.log(r["shape"][0] / max(tokens, 1))), r["shape"][0]))
        s, shape = r["speedup"].get(recipe), "(" + ", ".join(map(str, r["shape"])) + ")"
        if s is None:
            reasons[name] = f"{shape}: {recipe} not measured"
            continue
        seen.setdefault(shape, [s, 0])[1] += 1
        ok = s >= min_speedup
        reasons[name] = f"{shape}: {recipe} {s:.2f}x {'>=' if ok else '<'} {min_speedup:g}"
        if ok:
            convert.append(name)
    shapes = ", ".join(f"{sh} {s:.2f}x ({c} Linear{'s' * (c > 1)})" for sh, (s, c) in seen.items()) or "none measured"
    if convert:
        line = (f"lowp: FP8 ({recipe}) for {len(convert)}/{len(linears)} Linears, where this GPU's table shows "
                f">= {min_speedup:g}x over bf16; (M, K, N): {shapes}")
    else:
        line = (f"lowp: no Linear gains from FP8 ({recipe}) on this GPU's table, so none converts; (M, K, N): "
                f"{shapes}; threshold lowp.fp8_min_speedup={min_speedup:g}")
    return Fp8Plan(convert, reasons, line)


def _fmt(cfg: LowpConfig, key: str):
    try:
        return parse_format(getattr(cfg, key))
    except ValueError as e:
        raise ConfigError(f"lowp.{key}: {e}") from None


@register
class LowPrecision(Technique):
    name = "lowp"
    kinds = ("gpt", "mlm", "vit", "mlp")
    needs = "a model of Linear layers (the emulation covers Linear, not convolutions)"
    Config = LowpConfig

    def __init__(self, cfg: LowpConfig, run_cfg):
        super().__init__(cfg, run_cfg)
        if cfg.backend == "torchao":
            if run_cfg.train.device == "cpu" or not torch.cuda.is_available():
                raise ConfigError("lowp.backend=torchao runs real FP8 GEMMs and needs a CUDA GPU (H100-class); "
                                  "on this machine use lowp.backend=emulate")
            if importlib.util.find_spec("torchao") is None:
                raise ConfigError("lowp.backend=torchao needs the torchao package: pip install torchao "
                                  "(or use lowp.backend=emulate)")
        if cfg.fp8_table:  # named on purpose: it must be there and well formed before anything trains
            if not Path(cfg.fp8_table).is_file():
                raise ConfigError(f"lowp.fp8_table={cfg.fp8_table}: no such file (make one with: {TABLE_CMD})")
            read_table(cfg.fp8_table)
        if math.frexp(cfg.loss_scale)[0] != 0.5:
            raise ConfigError(f"lowp.loss_scale={cfg.loss_scale} is not a power of two (only those scale exactly); "
                              "use e.g. 1024")
        self.wfmt = _fmt(cfg, "weights")
        outer = _fmt(cfg, "outer") if cfg.outer else None
        pick = lambda c: cfg.chunk if c < 0 else c  # noqa: E731
        self.gemms = LowpGemms(_fmt(cfg, "operand"), _fmt(cfg, "acc"), pick(cfg.chunk_fwd), pick(cfg.chunk_bgrad),
                               pick(cfg.chunk_wgrad), outer, cfg.acc_rounding, cfg.loss_scale)
        self.params: list[nn.Parameter] = []
        self.converted: list[str] = []
        self._before: list[torch.Tensor] = []
        self._same: Optional[torch.Tensor] = None   # weights the last step left unchanged (on the device)
        self.device = torch.device("cpu")
        self.fp8: dict = {}   # backend=torchao: what converted and why (metrics, so record.json)

    def fp8_choice(self, model: nn.Module, gpu_name: str) -> Fp8Plan:
        """The Linears of `model` the table (lowp.fp8_table, else this GPU's results/fp8_table_<gpu>.json) says
        gain from FP8 at this run's tokens per micro-batch (train.batch_size x model.seq_len)."""
        path = Path(self.cfg.fp8_table) if self.cfg.fp8_table else table_path(gpu_name)
        rows = read_table(path) if path.is_file() else None
        source = str(path.relative_to(RESULTS.parent)) if path.is_relative_to(RESULTS.parent) else str(path)
        linears = [(n, m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        tokens = self.run_cfg.train.batch_size * getattr(self.run_cfg.model, "seq_len", 1)
        return fp8_plan(rows, linears, tokens, self.cfg.fp8_recipe, self.cfg.fp8_min_speedup, source)

    def _generator(self, step: int, stream: int) -> torch.Generator:
        """The draws of one step's stochastic rounding, on the device the tensors live on."""
        return torch.Generator(self.device).manual_seed(seed_for(self.run_cfg.train.seed, step, stream))

    def fsdp_refusal(self) -> str:
        return ("it swaps the model's Linear layers and rounds the weights and AdamW moments in place with draws "
                "over whole tensors, which FSDP holds as shards")

    def setup(self, trainer) -> None:
        model = trainer.raw_model
        self.device = trainer.accelerator.device
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        if self.cfg.backend == "torchao":
            gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
            plan = self.fp8_choice(model, gpu)
            trainer.accelerator.print(plan.line, flush=True)
            chosen = set(plan.convert)
            if chosen:
                from torchao.float8 import Float8LinearConfig, convert_to_float8_training
                convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(self.cfg.fp8_recipe),
                                           module_filter_fn=lambda m, fqn: fqn in chosen)
            self.converted, self.kept = list(plan.convert), [n for n in linears if n not in chosen]
            self.fp8 = dict(fp8_layers=f"{len(plan.convert)}/{len(linears)}", fp8_recipe=self.cfg.fp8_recipe,
                            fp8_reason=plan.line)
            return
        keep = (linears[0], linears[-1]) if self.cfg.keep_first_last and linears else ()
        self.kept = list(dict.fromkeys(keep))
        self.converted = convert(model, self.gemms, keep)
        mods = dict(model.named_modules())
        seen: dict[int, nn.Parameter] = {}
        for n in self.converted:
            for p in mods[n].parameters(recurse=False):
                seen.setdefault(id(p), p)
        self.params = list(seen.values())
        self._round(trainer, None, "nearest")  # the stored weights start in the format

    def update_plan(self, plan, step: int, micro_step: int) -> None:
        if micro_step == 0 and self.params:
            self.gemms.generator = self._generator(step, ACC_STREAM)
            self._before = [p.detach().clone() for p in self.params]

    def step_end(self, trainer) -> None:
        if not self.params:
            return
        self._round(trainer, self._generator(trainer.state.step, UPDATE_STREAM), self.cfg.update)
        if self._before:
            # a device tensor, read at log steps only (metrics): no wait for the device every step
            self._same = torch.stack([(p == b).sum() for p, b in zip(self.params, self._before)]).sum()

    @property
    def frozen(self) -> float:
        """The share of emulated weights the last step left exactly unchanged."""
        return 0.0 if self._same is None else int(self._same) / sum(p.numel() for p in self.params)

    @torch.no_grad()
    def _round(self, trainer, g: torch.Generator, rounding: str) -> None:
        """Round the emulated layers' weights and AdamW moments to the storage format, in place."""
        if self.wfmt.is_fp32:
            return
        opt_state = trainer.optimizer.state
        for p in self.params:
            p.copy_(quantize(p.float(), self.wfmt, rounding, g))
            for k in ("exp_avg", "exp_avg_sq", "momentum_buffer"):  # AdamW's moments, SGD's momentum
                if k in opt_state.get(p, {}):
                    opt_state[p][k].copy_(quantize(opt_state[p][k].float(), self.wfmt, rounding, g))

    def metrics(self, state) -> dict:
        if self.fp8:   # backend=torchao: "fp8_layers": converted / all Linears, the recipe and the one-line why
            return dict(self.fp8)
        # the share of emulated weights this step left exactly unchanged (round-to-nearest stalls small updates)
        return dict(lowp_frozen=round(self.frozen, 5)) if self.params else {}
