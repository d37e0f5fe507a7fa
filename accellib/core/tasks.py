"""What the one training loop trains on: language modelling or image classification.

What the one training loop trains on: a task supplies the data, the loss and its metrics, the
evaluation, and the compute accounting; the trainer (accellib/core/trainer.py) does everything else
(micro-batches, techniques' plans, gradient accumulation, clipping, checkpoints, logs).

    task = make_task(cfg)                     # by model.kind: gpt | mlm -> LMTask, vit | cnn | mlp -> ImageTask
    task.configure()                          # fill the model fields the data decides (vocab_size, vit's seq_len)
    model = task.build_model()
    x, y = task.batch(step, index)            # drawn from (seed, step, index) only: any process can rebuild it
    x, y = task.sample(generator)             # one micro-batch from any generator (SBLD's profiling batches)
    out, loss, metrics = task.forward(model, x, y, plan)     # metrics: e.g. {"acc": ...}, logged as train_acc
    x_val, y_val = task.eval_data()           # fixed: every evaluation scores the same examples
    sums = task.eval_sums(model, x, y)        # per-example sums, gathered over processes by the trainer
    task.eval_metrics({k: total})             # -> {"val_loss", "val_bpb"} or {"val_loss", "val_acc"}
    task.micro_flops(plan), task.micro_tokens(), task.micro_layer_tokens(plan)   # one micro-batch, one process
    task.references()                         # reference losses drawn on every loss plot

`index` is the global micro-batch index m * world + rank, so 2 processes x 1 micro-batch see exactly
the data of 1 process x 2 micro-batches.
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import Optional

import torch
import torch.nn.functional as Fn

from ..analysis import flops as F
from .options import ConfigError
from ..data.tokens import disjoint_batch, eval_windows, generator_for, load_token_data, mask_tokens, ngram_references, sample_batch
from ..models.losses import CHUNK_ELEMENTS
from ..models.transformer import Plan, Transformer, labelled_positions

IMAGE_KINDS = ("vit", "cnn", "mlp")


class _Task:
    """What both tasks share: the config, and the data opened from cfg.data.path on first use. `every_rank`: every
    process of the launch opens it at the same point (see accellib.data.tokens.load_token_data)."""

    def __init__(self, cfg, data=None, every_rank: bool = False):
        self.cfg, self._data, self.every_rank = cfg, data, every_rank

    @property
    def data(self):
        if self._data is None:
            self._data = self.open(self.cfg.data.path)
        return self._data

    def batch(self, step: int, index: int, per_step: int = 1):
        """Global micro-batch `index` of optimizer step `step`, of `per_step` such micro-batches per step (all
        ranks): drawn from (seed, step, index) only."""
        return self.sample(generator_for(self.cfg.train.seed, step, index))


class LMTask(_Task):
    """Language modelling on a token folder (data/shakespeare, ...): next-token (gpt) or masked (mlm)."""

    def open(self, path):
        return load_token_data(path, verify=self.cfg.data.verify, every_rank=self.every_rank)

    @property
    def n_blocks(self) -> int:
        return self.cfg.model.n_layer

    def configure(self) -> None:
        m, d = self.cfg.model, self.data
        if m.init_from:  # a GPT-2 checkpoint decides the architecture (accellib/export.py)
            from ..models.hf_gpt2 import configure_from_hf
            configure_from_hf(m, d.vocab_size)
        if m.vocab_size == 0:
            m.vocab_size = model_vocab_size(d, m.kind)
        if m.vocab_size < d.vocab_size:
            raise ConfigError(f"model.vocab_size={m.vocab_size} is smaller than the vocabulary of "
                              f"{self.cfg.data.path} ({d.vocab_size} ids, meta.json); leave it 0 to take "
                              "the data's size")
        if self.cfg.data.windows == "disjoint" and m.kind != "gpt":
            raise ConfigError(f"data.windows=disjoint is for model.kind=gpt (got {m.kind}); use data.windows=random")
        if m.kind == "mlm" and d.mask_id is None:
            raise ConfigError(f"model.kind=mlm needs a [MASK] id in {self.cfg.data.path}/meta.json; "
                              "re-run data_scripts/prepare_shakespeare.py --force")

    def build_model(self) -> torch.nn.Module:
        model = Transformer(self.cfg.model)
        if self.cfg.model.init_from:
            from ..models.hf_gpt2 import init_from_hf
            init_from_hf(model, self.cfg.model)
        return model

    def batch(self, step: int, index: int, per_step: int = 1):
        c = self.cfg
        if c.data.windows == "random":
            return super().batch(step, index, per_step)
        B = c.train.batch_size
        return disjoint_batch(self.data.train, B, c.model.seq_len, c.train.seed, (step * per_step + index) * B)

    def sample(self, g: torch.Generator):
        """One micro-batch drawn with `g` (batch() draws with the training stream's generator)."""
        c = self.cfg
        x, y = sample_batch(self.data.train, c.train.batch_size, c.model.seq_len, g)
        if c.model.kind == "mlm":
            # random replacements are drawn from the data's ids, never from the model's padding rows
            x, y = mask_tokens(x, self.data.mask_id, self.data.vocab_size, g, c.data.mlm_prob)
        return x, y

    def head_tokens(self, seq_len: int) -> int:
        """Positions per sequence the LM head scores: all of them (gpt), or the masked ones (mlm)."""
        return mlm_labels_per_row(seq_len, self.cfg.data.mlm_prob) if self.cfg.model.kind == "mlm" else seq_len

    def positions(self, y) -> Optional[torch.Tensor]:
        """For mlm, the (B, k) positions of y's labels, where the head runs (Transformer.forward); else None."""
        return labelled_positions(y, self.head_tokens(y.size(1))) if self.cfg.model.kind == "mlm" else None

    def forward(self, model, x, y, plan: Optional[Plan]):
        """The logits returned (techniques' extra_loss gets them) are (B, T, V), or for mlm (B, k, V):
        the masked positions only."""
        logits, loss = model(x, y, plan=plan, positions=self.positions(y))
        return logits, loss, {}

    def eval_data(self):
        c = self.cfg
        w = eval_windows(self.data.val, c.model.seq_len, c.train.eval_windows)  # (n, T+1)
        x, y = w[:, :-1], w[:, 1:]
        if c.model.kind == "mlm":  # fixed masking so every evaluation scores the same positions
            x, y = mask_tokens(x, self.data.mask_id, self.data.vocab_size,
                               generator_for(c.train.seed, 2**31 - 1), c.data.mlm_prob)
        return x, y

    def eval_sums(self, model, x, y) -> dict:
        pos = self.positions(y)
        logits, _ = model(x, positions=pos)
        if pos is not None:
            y = torch.gather(y, 1, pos)   # (b, k): the labels where the head ran
        # fp32 per sequence, a chunk of sequences at a time (no fp32 copy of a whole bf16 batch's logits)
        rows = max(1, CHUNK_ELEMENTS // logits[0].numel())
        nll = torch.cat([Fn.cross_entropy(lg.float().transpose(1, 2), t, ignore_index=-100, reduction="none")
                         for lg, t in zip(logits.split(rows), y.split(rows))])   # (b, T or k)
        valid = (y != -100).float()
        return dict(loss=(nll * valid).sum(1), count=valid.sum(1))

    def eval_metrics(self, totals: dict) -> dict:
        val = totals["loss"] / totals["count"]
        bpt = self.data.meta.get("bytes_per_token", 1.0)
        return dict(val_loss=val, val_bpb=val / math.log(2) / bpt)

    def micro_flops(self, plan: Optional[Plan]) -> float:
        c = self.cfg
        return F.train_step_flops(c.model, c.train.batch_size, c.model.seq_len, plan,
                                  head_tokens=self.head_tokens(c.model.seq_len))

    def micro_tokens(self) -> int:
        return self.cfg.train.batch_size * self.cfg.model.seq_len

    def micro_layer_tokens(self, plan: Optional[Plan]) -> int:
        c = self.cfg
        return F.layer_tokens(plan, c.model.n_layer, c.train.batch_size, c.model.seq_len)

    def uniform_loss(self) -> float:
        """The loss of predicting every id alike: where a random model starts."""
        return math.log(self.data.vocab_size)

    def references(self) -> dict:
        c = self.cfg
        return ngram_references(self.data, c.model.seq_len, c.train.eval_windows)


class ImageTask(_Task):
    """Image classification on an image folder (data/digits, data/mnist, data/cifar10; see
    accellib/data/images.py) with a cnn, mlp or vit (accellib/models/vision.py). `tokens` counts images."""

    @staticmethod
    def open(path):
        from ..data.images import load_image_data
        return load_image_data(path)

    @property
    def n_blocks(self) -> int:  # blocks a Plan addresses: the ViT's; the CNN and MLP have none
        return self.cfg.model.n_layer if self.cfg.model.kind == "vit" else 0

    def configure(self) -> None:
        m, d = self.cfg.model, self.data
        if self.cfg.data.windows != "random":
            raise ConfigError(f"data.windows={self.cfg.data.windows} is for language models; image tasks draw random "
                              "images: use data.windows=random")
        if m.kind == "vit":
            if d.image_size % m.patch:
                raise ConfigError(f"model.patch={m.patch} does not divide the {d.image_size}x{d.image_size} images "
                                  f"of {self.cfg.data.path}; choose a divisor of {d.image_size}")
            m.seq_len = (d.image_size // m.patch) ** 2 + 1  # the patches and the class token

    def _shape(self) -> tuple[int, int, int]:
        """(channels, image_size, n_classes): from the opened data, else from meta.json only (so counting
        FLOPs, e.g. compare's budgets and the V-cycle's ledger, never reads or hashes the images)."""
        if self._data is not None:
            return self._data.channels, self._data.image_size, self._data.n_classes
        from ..data.images import image_shape
        return image_shape(self.cfg.data.path)

    def build_model(self) -> torch.nn.Module:
        from ..models.vision import build_model
        return build_model(self.cfg.model, *self._shape())

    def sample(self, g: torch.Generator):
        from ..data.images import image_batch
        return image_batch(self.data, self.cfg.train.batch_size, g)

    def _logits(self, model, x, plan=None):
        return model(x, plan=plan) if self.cfg.model.kind == "vit" else model(x)

    def forward(self, model, x, y, plan: Optional[Plan]):
        logits = self._logits(model, x, plan)
        loss = Fn.cross_entropy(logits.float(), y)
        return logits, loss, dict(acc=(logits.detach().argmax(-1) == y).float().mean())

    def eval_data(self):
        from ..data.images import split_tensors
        return split_tensors(self.data, "val")

    def eval_sums(self, model, x, y) -> dict:
        logits = self._logits(model, x).float()
        return dict(loss=Fn.cross_entropy(logits, y, reduction="none"),
                    correct=(logits.argmax(-1) == y).float(), count=torch.ones_like(y, dtype=torch.float32))

    def eval_metrics(self, totals: dict) -> dict:
        return dict(val_loss=totals["loss"] / totals["count"], val_acc=totals["correct"] / totals["count"])

    @cached_property
    def _forward_flops(self) -> tuple[int, int]:
        """(FLOPs of one image's forward pass outside the ViT blocks, of one full-length block); counted
        on a fresh model by accellib.models.vision.forward_flops (for a ViT, minus its blocks' analytic count)."""
        from ..models.vision import forward_flops
        (c, s, _), m = self._shape(), self.cfg.model
        total = forward_flops(self.build_model(), torch.zeros(1, c, s, s))
        if m.kind != "vit":
            return total, 0
        block = F.block_forward_flops(m, m.seq_len)
        return total - m.n_layer * block, block

    def micro_flops(self, plan: Optional[Plan]) -> float:
        outside, _ = self._forward_flops
        m = self.cfg.model
        blocks = (sum(F.block_forward_flops(m, n) for n in F.block_tokens(plan, m.n_layer, m.seq_len) if n)
                  if m.kind == "vit" else 0)
        return 3 * self.cfg.train.batch_size * (outside + blocks)

    def micro_tokens(self) -> int:
        return self.cfg.train.batch_size

    def micro_layer_tokens(self, plan: Optional[Plan]) -> int:
        m = self.cfg.model
        return F.layer_tokens(plan, m.n_layer, self.cfg.train.batch_size, m.seq_len) if m.kind == "vit" else 0

    def uniform_loss(self) -> float:
        return math.log(self.data.n_classes)

    def references(self) -> dict:
        return {"uniform": math.log(self.data.n_classes)}  # the loss of guessing every class alike


def mlm_labels_per_row(seq_len: int, prob: float) -> int:
    """Positions accellib.data.tokens.mask_tokens labels in each row of seq_len tokens: k = max(1, round(prob*T))."""
    return max(1, round(prob * seq_len))


PAD_MULTIPLE = 64   # GPT-2's 50,257 ids -> 50,304 rows, as nanoGPT (tensor-core friendly matrix shapes)


def model_vocab_size(data, kind: str) -> int:
    """The model's vocabulary for token data `data` (a TokenData) when model.vocab_size is 0.

    GPT-2 tokenizer data is padded up to a multiple of PAD_MULTIPLE: the head's matmul then has
    tensor-core friendly shapes (nanoGPT's 50,304). A causal run sizes it from the real ids, without the
    [MASK] id the data reserves (GPT-2's 50,257 -> 50,304); a masked LM needs [MASK] (50,258 -> 50,304).
    The padding rows are never a target, so training pushes their logits down; sampling draws only the
    data's ids, mask_tokens' random ids come from the data's vocabulary, and the HF export strips them.

    Byte and our own BPE data keep their exact size: the byte tutorial's 257 rows are what every cached
    result in results/ was trained with, and the byte exporter's eos is the [MASK] id 256, the last row."""
    if data.meta.get("tokenizer") != "gpt2":
        return data.vocab_size
    real = data.vocab_size
    if kind == "gpt" and data.mask_id is not None and data.mask_id == real - 1:
        real -= 1   # [MASK] is the last id: a causal LM never reads or predicts it
    return -(-real // PAD_MULTIPLE) * PAD_MULTIPLE


def is_image_kind(kind: str) -> bool:
    return kind in IMAGE_KINDS


def make_task(cfg, data=None, every_rank: bool = False):
    """The task of cfg.model.kind, on `data` (opened from cfg.data.path when None). every_rank=True only where every
    process of the launch makes it (it may then share one process's data checks: a collective)."""
    return (ImageTask if is_image_kind(cfg.model.kind) else LMTask)(cfg, data, every_rank)
