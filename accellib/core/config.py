"""Run configuration: plain dataclasses, a YAML file, and `--section.key=value` overrides.

    cfg = load_config("configs/tiny.yaml", ["--train.steps=50", "--pld.enabled=true"])

Every field is declared with `opt(default, help, min=, max=, choices=)`; that metadata drives
validation (one-line `ConfigError` naming the key and what is allowed) and `--help`.
Technique sections (`pld`, `random_ltd`, ...) come from `accellib.techniques.REGISTRY`.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from ..models.transformer import ModelConfig
from .options import ConfigError, opt


@dataclass
class DataConfig:
    path: str = opt("data/shakespeare", "token-data folder written by data_scripts/")
    windows: str = opt("random", "how training windows are drawn: random = uniform start positions (windows overlap "
                       "and repeat); disjoint = a seeded order of non-overlapping windows, none read twice until the "
                       "split has been read once (fresh data; the over-trained experiment's corpus)",
                       choices=["random", "disjoint"])
    mlm_prob: float = opt(0.15, "masking probability for model.kind=mlm", min=0.01, max=0.9)
    verify: str = opt("cached", "checksums of the token files at start: cached = hash a file once, then trust it while "
                      "its size, mtime, inode and ctime are unchanged; full = hash every file at every start", choices=["cached", "full"], resume=True)


@dataclass
class OptimConfig:
    name: str = opt("adamw", "adamw, or sgd (the standardization-loss paper's MNIST protocol; momentum below)",
                    choices=["adamw", "sgd"])
    momentum: float = opt(0.0, "sgd only: heavy-ball momentum, in [0, 1)", min=0.0, below=1.0, resume=True)
    lr: float = opt(5e-3, "peak learning rate", min=0.0, max=1.0, resume=True)
    min_lr_ratio: float = opt(0.1, "cosine decays to lr * min_lr_ratio", min=0.0, max=1.0, resume=True)
    warmup_steps: int = opt(20, "linear warm-up, in optimizer steps", min=0, resume=True)
    weight_decay: float = opt(0.1, "weight decay of matrices and conv kernels (AdamW: decoupled; sgd: L2)", min=0.0, resume=True)
    beta1: float = opt(0.9, "AdamW beta1, in [0, 1)", min=0.0, below=1.0, resume=True)
    beta2: float = opt(0.95, "AdamW beta2, in [0, 1)", min=0.0, below=1.0, resume=True)
    grad_clip: float = opt(1.0, "global grad-norm clip; 0 disables", min=0.0, resume=True)


@dataclass
class TrainConfig:
    steps: int = opt(300, "optimizer steps", min=1, resume=True)
    batch_size: int = opt(32, "sequences per micro-batch per process", min=1)
    grad_accum: int = opt(1, "micro-batches per optimizer step", min=1)
    eval_every: int = opt(50, "evaluate every N steps (and at the end); 0 = only at the end", min=0, resume=True)
    eval_windows: int = opt(64, "fixed validation windows per evaluation", min=1)
    log_every: int = opt(10, "train-loss log interval in steps", min=1, resume=True)
    checkpoint_every: int = opt(100, "checkpoint every N steps (always at the end); 0 = end only", min=0, resume=True)
    keep_checkpoints: int = opt(1, "checkpoints kept: the newest is checkpoints/last, the N-1 before it "
                                "checkpoints/step_<k> (each a whole Accelerate checkpoint, as large as last)", min=1,
                                resume=True)
    seed: int = opt(1337, "seed for init, data order and technique randomness", min=0)
    precision: str = opt("auto", "auto = bf16 on a bf16-capable GPU, else fp32",
                         choices=["auto", "fp32", "bf16"])
    progress: bool = opt(True, "tqdm progress bar on the main process; false = one log line per log_every steps", resume=True)
    device: str = opt("auto", "auto = CUDA when present, else CPU; cuda = refuse to run without CUDA "
                      "(the full-scale configs); cpu = the CPU even when CUDA is present",
                      choices=["auto", "cuda", "cpu"], resume=True)
    threads: int = opt(0, "torch CPU threads per process; 0 = leave torch's default", min=0, resume=True)
    compile: str = opt("none", "none; model = torch.compile the whole model, loss included (fastest, for runs whose "
                       "block plan never changes); blocks = each transformer block on its own, so a technique's "
                       "changing plan (skipped blocks, PLD scales, kept tokens) reuses a few graphs",
                       choices=["none", "model", "blocks"], resume=True)
    compile_backend: str = opt("inductor", "torch.compile backend of train.compile (eager / aot_eager: to debug)",
                               choices=["inductor", "aot_eager", "eager"], resume=True)
    peak_flops: float = opt(0.0, "peak FLOP/s of one device, for the MFU of every log line; 0 = the table in "
                            "accellib/core/hardware.py (GPUs) or a matmul measured at start (CPU)", min=0.0, resume=True)
    stop_on_divergence: bool = opt(False, "a log step whose training loss is over 1 nat above the lower of its best so "
                                   "far and the uniform prediction's is flagged (a warning); true = a flagged window or an "
                                   "evaluation over 1 nat above the best validation opens a doubt (evaluated at every log "
                                   "step, no checkpoint written); validation still that high after train.divergence_window "
                                   "steps is a divergence: go back to the last good checkpoint and skip the batches since, "
                                   "at most train.divergence_rewinds times, then stop (one line, with the command that "
                                   "goes on)", resume=True)
    divergence_window: int = opt(10, "with stop_on_divergence: validation over 1 nat above its best at every evaluation "
                                 "for this many steps (or at the last step) is a divergence; one evaluation is a spike",
                                 min=1, resume=True)
    divergence_rewinds: int = opt(3, "with stop_on_divergence: a divergence goes back to the last good checkpoint and "
                                  "skips the batches that followed it, at most this many times; then the run stops",
                                  min=0, resume=True)
    flops_budget: float = opt(0.0, "also stop once the training FLOPs (all processes) reach this; 0 = off "
                              "(compare --budget flops sets it to the baseline's)", min=0.0)


TRACKERS = ["tensorboard", "trackio", "wandb"]


@dataclass
class LogConfig:
    trackers: list[str] = opt([], "live experiment trackers through Accelerate, sent the numbers of metrics.jsonl "
                              "(which stays the record); tensorboard writes <run>/tensorboard/<project>/ (view: "
                              "tensorboard --logdir runs); e.g. --log.trackers=tensorboard,wandb; [] = none",
                              choices=TRACKERS, resume=True)
    project: str = opt("", "the trackers' project name (TensorBoard: its subfolder); '' = the run folder's name", resume=True)


MODEL_HELP = dict(
    kind=dict(help="gpt = causal LM, mlm = masked LM; image classifiers (data from data_scripts/prepare_digits.py "
                   "or prepare_hf_images.py): vit = ViT of the blocks below, cnn / mlp = the MNIST CNN / MLP of "
                   "Collins et al. 2019 (their sizes are fixed; n_layer, d_model, ... do not apply)",
              choices=["gpt", "mlm", "vit", "cnn", "mlp"]),
    vocab_size=dict(help="set from the data's meta.json when 0 (GPT-2-tokenizer data: padded to a multiple of 64, 50,304, without a [MASK] row in causal runs)", min=0),
    seq_len=dict(help="context length", min=2), n_layer=dict(help="blocks", min=1),
    n_head=dict(help="attention heads", min=1), d_model=dict(help="width", min=8),
    mlp_ratio=dict(help="FFN hidden / d_model", min=1),
    tie_head=dict(help="tie LM head and token embedding"), bias=dict(help="biases in Linear layers"),
    init_std=dict(help="init std of weights", min=0.0),
    norm=dict(help="gpt/mlm/vit: layer (pre-LN) or none (no LayerNorm at all); cnn/mlp: none, batch (shift "
                   "only), layer or group", choices=["layer", "none", "batch", "group"]),
    patch=dict(help="vit: patch size (seq_len is set to patches + 1 from the data)", min=1),
    act=dict(help="the MLP's GELU: gelu (exact) or gelu_tanh (GPT-2's tanh approximation)",
             choices=["gelu", "gelu_tanh"]),
    init_from=dict(help="gpt: hf:PATH_OR_NAME starts from a transformers GPT-2 checkpoint (a local folder, or a "
                        "hub name when online); its n_layer, n_head, d_model, mlp_ratio, act, tie_head and bias "
                        "replace this config's, seq_len may be at most its n_positions"),
)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(vocab_size=0))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    techniques: dict = field(default_factory=dict)   # name -> technique config dataclass

    def sections(self) -> dict[str, Any]:
        return dict(model=self.model, data=self.data, optim=self.optim, train=self.train, log=self.log,
                    **self.techniques)

    def enabled(self) -> list[str]:
        return [n for n, c in self.techniques.items() if getattr(c, "enabled", False)]

    def to_dict(self) -> dict:
        return {k: dataclasses.asdict(v) for k, v in self.sections().items()}


def default_config() -> RunConfig:
    from ..techniques import REGISTRY
    return RunConfig(techniques={name: t.Config() for name, t in REGISTRY.items()})


# ----------------------------------------------------------------------------- validation
def _meta(section: str, f: dataclasses.Field) -> dict:
    if section == "model":
        return MODEL_HELP.get(f.name, {})
    return dict(f.metadata)


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check/convert one value against a field's annotated type."""
    origin = typing.get_origin(typ)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        return None if value is None else _coerce(key, value, args[0])
    if origin in (list, tuple):
        if isinstance(value, str) and typing.get_args(typ)[:1] == (str,):  # --log.trackers=tensorboard,wandb
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, e.g. [1, 2], got {value!r}")
        (inner,) = typing.get_args(typ)[:1] or (Any,)
        return [_coerce(key, v, inner) for v in value]
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def _check_range(key: str, value: Any, meta: dict) -> None:
    lo, hi, below, choices = meta.get("min"), meta.get("max"), meta.get("below"), meta.get("choices")
    vals = value if isinstance(value, list) else [value]
    for v in vals:
        if choices is not None and v not in choices:
            raise ConfigError(f"{key}={v!r} is not allowed; choose one of {choices}")
        if lo is not None and v is not None and v < lo:
            raise ConfigError(f"{key}={v!r} is below the minimum {lo}")
        if hi is not None and v is not None and v > hi:
            raise ConfigError(f"{key}={v!r} is above the maximum {hi}")
        if below is not None and v is not None and v >= below:
            raise ConfigError(f"{key}={v!r} must be below {below}")


def _update(section: str, obj: Any, values: dict) -> None:
    if not isinstance(values, dict):
        raise ConfigError(f"section '{section}' must be a mapping of key: value")
    hints = typing.get_type_hints(type(obj))
    by_name = {f.name: f for f in fields(obj)}
    for k, v in values.items():
        if k not in by_name:
            raise ConfigError(f"unknown config key '{section}.{k}'; allowed: {', '.join(sorted(by_name))}")
        key = f"{section}.{k}"
        v = _coerce(key, v, hints[k])
        _check_range(key, v, _meta(section, by_name[k]))
        setattr(obj, k, v)


def apply_dict(cfg: RunConfig, d: dict, source: str = "the config") -> RunConfig:
    if d is not None and not isinstance(d, dict):
        raise ConfigError(f"{source} must be a mapping of sections (model:, train:, ...), "
                          f"got a {type(d).__name__}; see configs/tiny.yaml")
    sections = cfg.sections()
    for name, values in (d or {}).items():
        if name not in sections:
            raise ConfigError(f"unknown config section '{name}'; allowed: {', '.join(sections)}")
        _update(name, sections[name], values)
    validate(cfg)
    return cfg


def parse_overrides(args: list[str]) -> dict:
    """['--train.steps=50', '--pld.enabled=true'] -> {'train': {'steps': 50}, 'pld': {'enabled': True}}"""
    out: dict = {}
    for a in args:
        if not a.startswith("--") or "=" not in a or "." not in a.split("=", 1)[0]:
            raise ConfigError(f"bad override {a!r}; write --section.key=value, e.g. --train.steps=100")
        key, raw = a[2:].split("=", 1)
        section, name = key.split(".", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.setdefault(section, {})[name] = value
    return out


class DuplicateKey(Exception):
    """A mapping of a YAML document writes a key twice: (dotted key, first line, second line)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last value without a word,
    so `lr: 1e-3` ... `lr: 3e-4` trained at the second); `<<` merges are not duplicates."""

    def construct_document(self, node):
        self._check(node, "", set())
        return super().construct_document(node)

    def _check(self, node, path: str, seen: set) -> None:
        if id(node) in seen:  # an alias met again
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    key = f"{path}.{k.value}" if path else k.value
                    if (k.tag, k.value) in first:
                        raise DuplicateKey(key, first[(k.tag, k.value)], k.start_mark.line + 1)
                    first[(k.tag, k.value)] = k.start_mark.line + 1
                    self._check(v, key, seen)
                else:
                    self._check(v, path, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self._check(v, f"{path}[{i}]", seen)


def load_yaml(text: str, source: str = "the YAML"):
    """yaml.safe_load that refuses a duplicate key in one line (ConfigError naming `source`, the key, both lines)."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKey as e:
        key, a, b = e.args
        raise ConfigError(f"{source}: the key {key} is written twice (lines {a} and {b}); keep one of them "
                          "(YAML would silently take the second)") from None


def read_yaml(path: str | Path):
    """A config file's YAML (None for an empty file), or a one-line ConfigError if it is missing, invalid or writes
    a key twice."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} not found; see configs/ for the shipped ones")
    try:
        return load_yaml(p.read_text(), str(p))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None,
                extra: Optional[dict] = None) -> RunConfig:
    """Defaults <- YAML file <- `extra` dict <- command-line overrides, validated."""
    cfg = default_config()
    if path is not None:
        p = Path(path)
        raw = read_yaml(p)
        if raw is None:  # an empty file would otherwise train on the defaults without a word
            raise ConfigError(f"{p} is empty; write at least one section (see configs/tiny.yaml), "
                              "or leave out --config to train on the defaults")
        apply_dict(cfg, raw, str(p))
    if extra:
        apply_dict(cfg, extra)
    return apply_dict(cfg, parse_overrides(overrides or []))


def changed_options(stored: str | Path, cfg: RunConfig) -> dict:
    """{"section.key": value} where `cfg` differs from the config file `stored` (a run's config.yaml), model.vocab_size
    aside (the data fills it in): what a resume changed."""
    old, new = load_config(stored).to_dict(), cfg.to_dict()
    return {f"{s}.{k}": new[s][k] for s, d in old.items() for k, v in d.items()
            if new[s][k] != v and (s, k) != ("model", "vocab_size")}


def validate(cfg: RunConfig) -> None:
    m = cfg.model
    if m.d_model % m.n_head:
        raise ConfigError(f"model.d_model={m.d_model} must be divisible by model.n_head={m.n_head}")
    if m.kind in ("gpt", "mlm", "vit") and m.norm not in ("layer", "none"):
        raise ConfigError(f"model.norm={m.norm} is for model.kind=cnn or mlp; a transformer takes layer or none")
    if m.init_from and not (m.init_from.startswith("hf:") and len(m.init_from) > 3):
        raise ConfigError(f"model.init_from={m.init_from!r} is not hf:PATH_OR_NAME, e.g. hf:gpt2 or hf:runs/x/hf")
    if m.init_from and m.kind != "gpt":
        raise ConfigError(f"model.init_from loads a causal GPT-2 and needs model.kind=gpt, not {m.kind}")
    if "/" in cfg.log.project or "\\" in cfg.log.project or cfg.log.project in (".", ".."):
        raise ConfigError(f"log.project={cfg.log.project!r} would put the trackers' files outside <run>/tensorboard/; "
                          "give a plain name without / or .., e.g. --log.project=tiny")
    if cfg.train.compile == "blocks" and m.kind in ("cnn", "mlp"):
        raise ConfigError(f"train.compile=blocks compiles transformer blocks, and model.kind={m.kind} has none; "
                          "use train.compile=none")
    if m.vocab_size and m.kind == "mlm" and m.vocab_size < 3:
        raise ConfigError("model.vocab_size must be >= 3 for model.kind=mlm")
    for name, c in cfg.techniques.items():
        if hasattr(c, "validate"):
            try:
                c.validate()
            except (ValueError, AssertionError) as e:
                raise ConfigError(f"{name}: {e}") from None


def with_horizon(cfg: RunConfig, steps: int) -> RunConfig:
    """A copy of `cfg` that trains for `steps` optimizer steps with every schedule stretched to the new
    horizon, so an arm given more (or fewer) steps keeps the shape of its schedules: the LR's cosine
    already ends at train.steps; fields marked `horizon="steps"` (e.g. random_ltd.ramp_steps) scale by
    steps / train.steps, fields marked `horizon="rate"` (e.g. pld.gamma) by the inverse. The LR warm-up
    (optim.warmup_steps) stays as it is: it protects the first updates whatever the run's length."""
    import copy
    c = copy.deepcopy(cfg)
    f = steps / cfg.train.steps
    for section in c.sections().values():
        for fd in fields(section):
            kind, v = fd.metadata.get("horizon"), getattr(section, fd.name)
            if kind == "steps" and v > 0:
                setattr(section, fd.name, max(1, round(v * f)))
            elif kind == "rate":
                setattr(section, fd.name, v / f)
    c.train.steps = steps
    return c


def help_text() -> str:
    """Every option with its default and help, for `--help`."""
    lines = []
    for section, obj in default_config().sections().items():
        lines.append(f"[{section}]")
        for f in fields(obj):
            meta = _meta(section, f)
            extra = f" (one of {meta['choices']})" if meta.get("choices") else ""
            extra += " [a --resume may change it]" if meta.get("resume") else ""
            lines.append(f"  --{section}.{f.name}={getattr(obj, f.name)!r:<14} {meta.get('help', '')}{extra}")
    return "\n".join(lines)
