"""Multi-level training's operators (coalesce, de-coalesce, interpolate) and its config section.

Multi-level training operators: coalesce, de-coalesce, interpolate (Zou, Zhang & Deng,
"A Multi-Level Framework for Accelerating Training Transformer Models", ICLR 2024, §3).

A V-cycle trains a cheap coalesced copy of the model in the middle of training:

    coalesce     large -> small: in width, pairs of whole heads / FFN chunks averaged (head size kept),
                 unit j with unit j + d/2 by default; in depth, block 2i with block 2i+1 (paper §3.2)
    de-coalesce  small -> large: units and blocks copied, each consumer's input weights split in half
    interpolate  theta_k = (1 - alpha) * theta_k^saved + alpha * D(theta_{k+1})  (paper §3.3; alpha
                 weights the de-coalesced model, as in the official code's `interpolate`)

Everything works on state_dicts and ModelConfigs, so the small model is a plain `Transformer`
with a smaller `ModelConfig` (same parameter names, `load_state_dict(strict=True)`).
The V-cycle driver that trains the stages is `accellib/drivers/vcycle.py`.

The two building blocks (paper §3.2; official code `MapMatrix`): a grouping g of large units into
small units gives
    P (n_large x n_small), P[j, g(j)] = 1       copy matrix: each large unit copies its small unit
    A = rownorm(P^T) (n_small x n_large)         averaging matrix: each small unit = mean of its group
    A @ P = I
A tensor dimension that a layer *produces* (a Linear's output rows, an embedding's columns, a
LayerNorm's entries) is mapped by A (coalesce) / P (de-coalesce); a dimension it *consumes* (a
Linear's input columns) by P^T on the right (coalesce: the pair's inputs are summed) / A^T on the
right (de-coalesce: each input weight is split across the duplicates). So a de-coalesced layer
sees P x_small and produces P y_small: width de-coalescing is exactly function-preserving for our
pre-LN GPT with an untied head. Depth de-coalescing (a block applied twice) is not.

Which units pair (`width_pairing`, `depth_pairing`). The paper's width matrix F_out = [I/2, I/2]^T
averages unit j with unit j + d/2: that is `half` (small unit i <- large units i and i + d/2; with
head-sized chunks, head h with head h + H/2, so merging stays head-aligned), which is also what the
official code does (its default template and its shipped L6-H6.json). The paper's prose says
"neighbouring" units, but its matrix is not `adjacent` (head 2h with 2h + 1); `adjacent` is offered
because it is equally function-preserving. In depth the paper averages adjacent blocks
(R[i, 2i] = R[i, 2i+1] = 1/2, the official code's default too): `adjacent`; the shipped L6-H6.json
instead pairs block i with block i + L/2 (`half`).

Embeddings and the LM head: where we differ from the official code. The official GPT-2 mapper
(map_tools/mapper.py, GPT2Mapper) multiplies the token and position embeddings by 2 after width
coalescing and by 0.5 after width de-coalescing. That is a side effect of GPT-2's tied head: an
embedding *produces* the residual stream (averaged / copied: E A^T, E P^T) while the head *consumes*
it (summed / halved: W P, W A). One tied matrix cannot be both; copied without a factor, the tied
logits double (P^T P = 2I), so the official code gives the tied matrix the head's factors and the
embeddings inherit them. In BERT the embedding LayerNorm absorbs that scale; in GPT-2's pre-LN
stream nothing does, and the residual stream starts at half scale (the official README's testbench
lists 9.3e-2 for GPT-2's width de-coalescing against 3.0e-7 for BERT). We untie the head instead
(`check_coalescable` refuses a tied one) and map embeddings and head each by its own role, with no
factor. Width de-coalescing then preserves the function of our pre-LN GPT: on a random model the
max |logit difference| is ~1e-6 in fp32, against ~1 with the official x0.5 applied to our embeddings
(`official_embedding_factor`; measured in tests/test_multilevel.py and notebook 04). Everything else
(block tensors, final LayerNorm, head, interpolation) maps as the official mapper does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

from ..core.options import ConfigError, opt
from ..models.transformer import ModelConfig
from . import register
from .base import Technique

PAIRINGS = ("half", "adjacent")


class MultiLevelError(ConfigError):
    """The model cannot be coalesced as asked; the message says what to change."""


# ----------------------------------------------------------------------------- matrices
def groups(n_large: int, factor: int, pairing: str) -> list[list[int]]:
    """Which large units (or chunks) form each small unit.
    half:     small i <- {i, i + n_s, i + 2 n_s, ...}: for pairs, unit j with j + n/2, the paper's width
              matrix F = [I/2, I/2]^T and the official code (head h with head h + H/2)
    adjacent: small i <- {f i, f i + 1, ..., f i + f - 1}: the paper's depth pairing (blocks 2i, 2i+1)"""
    if pairing not in PAIRINGS:
        raise MultiLevelError(f"pairing {pairing!r} is not one of {PAIRINGS}")
    if factor < 1 or n_large % factor:
        raise MultiLevelError(f"{n_large} units cannot be grouped by {factor}; use a count divisible by {factor}")
    n_s = n_large // factor
    if pairing == "half":
        return [[i + j * n_s for j in range(factor)] for i in range(n_s)]
    return [[i * factor + j for j in range(factor)] for i in range(n_s)]


def copy_averaging(n_large: int, factor: int = 2, pairing: str = "half", chunk: int = 1,
                   dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, P) for `n_large` chunks of `chunk` units each (a chunk = one head, so merging is
    head-aligned). A: (n_s*chunk, n_large*chunk), P: (n_large*chunk, n_s*chunk), A @ P = I."""
    gs = groups(n_large, factor, pairing)
    Fc = torch.zeros(len(gs), n_large, dtype=torch.float64)        # chunk-level grouping F
    for i, g in enumerate(gs):
        Fc[i, g] = 1.0
    F = torch.kron(Fc, torch.eye(chunk, dtype=torch.float64))      # (d_s, d_l)
    A = F / F.sum(1, keepdim=True)                                 # A = rownorm(F)
    P = F.T / F.T.sum(1, keepdim=True)                             # P = rownorm(F^T): exactly 0/1
    return A.to(dtype), P.to(dtype)


def depth_matrices(n_large: int, factor: int = 2, pairing: str = "adjacent") -> tuple[torch.Tensor, torch.Tensor]:
    """(R, G): small block i = sum_s R[i, s] * large block s; large block s = small block g(s).
    Paper default R[i, 2i] = R[i, 2i+1] = 1/2 (adjacent blocks averaged). R @ G = I."""
    return copy_averaging(n_large, factor, pairing, chunk=1, dtype=torch.float64)


# ----------------------------------------------------------------------------- configs
def check_coalescable(cfg: ModelConfig, factor: int = 2, width: bool = True, depth: bool = True) -> None:
    if cfg.tie_head and cfg.kind in ("gpt", "mlm"):
        raise MultiLevelError("multi-level training needs an untied LM head: set model.tie_head=false "
                              "(with a tied head width de-coalescing doubles every logit)")
    if width and cfg.n_head % factor:
        raise MultiLevelError(f"model.n_head={cfg.n_head} is not divisible by {factor}: width coalescing "
                              "merges whole heads (head size kept), so use an n_head divisible by it")
    if depth and cfg.n_layer % factor:
        raise MultiLevelError(f"model.n_layer={cfg.n_layer} is not divisible by {factor}: depth coalescing "
                              "merges groups of adjacent blocks")


def coalesced_config(cfg: ModelConfig, factor: int = 2, width: bool = True, depth: bool = True) -> ModelConfig:
    """L/f blocks, H/f heads of the same head size (d/f), FFN d/f * mlp_ratio; vocab, context same."""
    check_coalescable(cfg, factor, width, depth)
    return replace(cfg, n_layer=cfg.n_layer // factor if depth else cfg.n_layer,
                   n_head=cfg.n_head // factor if width else cfg.n_head,
                   d_model=cfg.d_model // factor if width else cfg.d_model)


# ----------------------------------------------------------------------------- width
# Which space each dimension of each parameter lives in, and whether the layer produces ("out")
# or consumes ("in") it. Spaces: h = residual width (head chunks), qkv = 3 stacked h's, f = FFN.
def _width_roles(name: str) -> list[tuple[int, str, str]]:
    leaf = name.split(".")
    what = leaf[-1]
    if what in ("cls", "pos"):                      # ViT (1, 1 or n, d): the stream's units, last
        return [(2, "h", "out")]
    kind = leaf[-2]
    if kind == "patch":                             # ViT patch embedding: conv (d, C, p, p), bias (d,)
        return [(0, "h", "out")]
    if kind == "head":                              # ViT classifier (classes, d): inputs summed
        return [(1, "h", "in")] if what == "weight" else []
    if kind in ("wte", "wpe"):                      # (V or T, d): columns are the stream's units
        return [(1, "h", "out")]
    if kind in ("ln_1", "ln_2", "ln_f"):            # (d,)
        return [(0, "h", "out")]
    if kind == "lm_head":                           # (V, d): vocab rows untouched, inputs summed
        return [(1, "h", "in")]
    if kind == "c_attn":                            # (3d, d): Q, K, V stacked, each by heads
        return [(0, "qkv", "out")] + ([(1, "h", "in")] if what == "weight" else [])
    if kind == "c_proj" and leaf[-3] == "attn":     # (d, d): inputs are the concatenated heads
        return [(0, "h", "out")] + ([(1, "h", "in")] if what == "weight" else [])
    if kind == "c_fc":                              # (r d, d)
        return [(0, "f", "out")] + ([(1, "h", "in")] if what == "weight" else [])
    if kind == "c_proj" and leaf[-3] == "mlp":      # (d, r d)
        return [(0, "h", "out")] + ([(1, "f", "in")] if what == "weight" else [])
    raise MultiLevelError(f"no multi-level mapping for parameter {name!r}")


def _width_maps(large: ModelConfig, factor: int, pairing: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    hd = large.head_dim
    A_h, P_h = copy_averaging(large.n_head, factor, pairing, chunk=hd)
    # FFN chunk = mlp_ratio * head_dim units, paired like the heads (as the official mapper pairs them)
    A_f, P_f = copy_averaging(large.n_head, factor, pairing, chunk=large.mlp_ratio * hd)
    A_q, P_q = torch.block_diag(A_h, A_h, A_h), torch.block_diag(P_h, P_h, P_h)
    return dict(h=(A_h, P_h), f=(A_f, P_f), qkv=(A_q, P_q))


def _along(M: torch.Tensor, W: torch.Tensor, dim: int) -> torch.Tensor:
    """Apply M (n_new, n_old) to dimension `dim` of W: the first, or the last."""
    M = M.to(W.dtype)
    if dim == 0 and W.dim() > 2:                    # a conv kernel (out, in, kh, kw): its rows
        return (M @ W.reshape(W.shape[0], -1)).reshape(M.shape[0], *W.shape[1:])
    return M @ W if dim == 0 else W @ M.T


BLOCK_LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")   # the Linears of a block


def _block_linear(name: str) -> Optional[str]:
    """"attn.c_attn" etc. for a parameter of one of a block's Linears, else None."""
    return next((l for l in BLOCK_LINEARS if name.endswith(f".{l}.weight") or name.endswith(f".{l}.bias")), None)


def coalesce_width(sd: dict, large: ModelConfig, factor: int = 2, pairing: str = "half",
                   linear_fn: Optional[Callable] = None) -> dict:
    """Width coalescing of a state_dict (paper §3.2). linear_fn (LevelMap.coalesce_linear): None = every tensor
    by the matrices below; a function (layer, n_head, W, b) -> (W_s, b_s) coalesces each Linear of every block
    instead (layer one of BLOCK_LINEARS, b zeros where the model has no bias); pairs with the half pairing only."""
    # out side: W_s = A_out W_l;  in side: W_s = W_l P_in  (pairs of inputs summed)
    maps = _width_maps(large, factor, pairing)
    routed: dict = {}
    if linear_fn is not None:
        if (factor, pairing) != (2, "half"):
            raise MultiLevelError(f"a coalesce_linear function coalesces pairs with the half pairing; this map has "
                                  f"factor {factor}, pairing {pairing!r}: use factor 2, width_pairing half")
        for k, W in sd.items():
            layer = _block_linear(k)
            if layer is None or not k.endswith(".weight"):
                continue
            bk = k[: -len("weight")] + "bias"
            b = sd.get(bk)
            Ws, bs = linear_fn(layer, large.n_head, W, b if b is not None else W.new_zeros(W.shape[0]))
            want = (W.shape[0] // 2, W.shape[1] // 2)
            if tuple(Ws.shape) != want or tuple(bs.shape) != want[:1]:
                raise MultiLevelError(f"coalesce_linear returned shapes {tuple(Ws.shape)}, {tuple(bs.shape)} for "
                                      f"{k} {tuple(W.shape)}; expected {want}, {want[:1]}")
            routed[k] = Ws
            if b is not None:
                routed[bk] = bs
    out = {}
    for k, W in sd.items():
        if k in routed:
            out[k] = routed[k]
            continue
        for dim, space, role in _width_roles(k):
            A, P = maps[space]
            W = _along(A if role == "out" else P.T, W, dim)
        out[k] = W
    return out


def decoalesce_width(sd: dict, large: ModelConfig, factor: int = 2, pairing: str = "half") -> dict:
    # out side: W_l = P_out W_s (rows copied);  in side: W_l = W_s A_in (each input weight halved)
    maps = _width_maps(large, factor, pairing)
    out = {}
    for k, W in sd.items():
        for dim, space, role in _width_roles(k):
            A, P = maps[space]
            W = _along(P if role == "out" else A.T, W, dim)
        out[k] = W
    return out


def official_embedding_factor(sd: dict, factor: float) -> dict:
    """The official GPT-2 mapper's extra step: token and position embeddings times `factor` (2 after
    width coalescing, 0.5 after width de-coalescing). The V-cycle does not use it (see the module
    docstring); it is here to measure what it does to our untied pre-LN GPT."""
    return {k: v * factor if k in ("transformer.wte.weight", "transformer.wpe.weight") else v for k, v in sd.items()}


# ----------------------------------------------------------------------------- depth
def _split_block_key(k: str) -> Optional[tuple[int, str]]:
    parts = k.split(".")
    if len(parts) > 3 and parts[0] == "transformer" and parts[1] == "h":
        return int(parts[2]), ".".join(parts[3:])
    return None


def _mix_blocks(sd: dict, M: torch.Tensor, n_out: int) -> dict:
    """New block i = sum_s M[i, s] * old block s (every tensor of the block); other keys copied."""
    out, blocks = {}, {}
    for k, W in sd.items():
        bk = _split_block_key(k)
        if bk is None:
            out[k] = W
        else:
            blocks.setdefault(bk[1], {})[bk[0]] = W
    for suffix, per_layer in blocks.items():
        for i in range(n_out):
            terms = [M[i, s].item() * per_layer[s] for s in range(M.shape[1]) if M[i, s] != 0]
            acc = terms[0]
            for t in terms[1:]:
                acc = acc + t
            out[f"transformer.h.{i}.{suffix}"] = acc
    return out


def coalesce_depth(sd: dict, n_layer: int, factor: int = 2, pairing: str = "adjacent") -> dict:
    R, _ = depth_matrices(n_layer, factor, pairing)        # (L_s, L_l)
    return _mix_blocks(sd, R, n_layer // factor)


def decoalesce_depth(sd: dict, n_layer: int, factor: int = 2, pairing: str = "adjacent") -> dict:
    _, G = depth_matrices(n_layer, factor, pairing)        # (L_l, L_s), 0/1: blocks copied
    return _mix_blocks(sd, G, n_layer)


# ----------------------------------------------------------------------------- one level
@dataclass
class LevelMap:
    """How level k (large) maps to level k+1 (small).

    coalesce_linear, the width-coalescing hook (paper §3.2, W_s = A_out W P_in, b_s = A_out b): None (the
    default) = accellib's matrices for every tensor; a function (layer, n_head, W, b) -> (W_s, b_s), the
    signature of notebook 04's exercise, coalesces each Linear of every block instead (coalesce_width), with
    factor 2 and the half pairing. Not a config option: set it on the LevelMap passed to `coalesce`."""
    factor: int = 2
    width: bool = True
    depth: bool = True
    width_pairing: str = "half"
    depth_pairing: str = "adjacent"
    coalesce_linear: Optional[Callable] = None


def coalesce(sd: dict, large: ModelConfig, m: LevelMap = LevelMap()) -> tuple[dict, ModelConfig]:
    """Large state_dict -> (small state_dict, small config). Width first, then depth (they commute)."""
    small = coalesced_config(large, m.factor, m.width, m.depth)
    sd = {k: v.detach() for k, v in sd.items()}
    if m.width:
        sd = coalesce_width(sd, large, m.factor, m.width_pairing, m.coalesce_linear)
    if m.depth:
        sd = coalesce_depth(sd, large.n_layer, m.factor, m.depth_pairing)
    return sd, small


def decoalesce(sd: dict, large: ModelConfig, m: LevelMap = LevelMap()) -> dict:
    """Small state_dict -> large state_dict (shapes of `large`)."""
    check_coalescable(large, m.factor, m.width, m.depth)
    sd = {k: v.detach() for k, v in sd.items()}
    if m.width:
        sd = decoalesce_width(sd, large, m.factor, m.width_pairing)
    if m.depth:
        sd = decoalesce_depth(sd, large.n_layer, m.factor, m.depth_pairing)
    return sd


def interpolate(saved: dict, decoalesced: dict, alpha: float) -> dict:
    """theta = (1 - alpha) * theta^saved + alpha * D(theta_small), matched by parameter name.
    alpha = 0 returns theta^saved and alpha = 1 returns D(theta_small), both bitwise."""
    if set(saved) != set(decoalesced):
        raise MultiLevelError(f"interpolation needs the same parameters; differing: "
                              f"{sorted(set(saved) ^ set(decoalesced))[:3]}")
    if not 0.0 <= alpha <= 1.0:
        raise MultiLevelError(f"multilevel.alpha={alpha} must be in [0, 1]")
    return {k: (1.0 - alpha) * saved[k] + alpha * decoalesced[k] for k in saved}


def level_configs(cfg: ModelConfig, levels: int, m: LevelMap = LevelMap()) -> list[ModelConfig]:
    """[level 0 = the target model, level 1, ..., level K-1 = the smallest]."""
    out = [cfg]
    for _ in range(levels - 1):
        out.append(coalesced_config(out[-1], m.factor, m.width, m.depth))
    return out


# ----------------------------------------------------------------------------- config section
@dataclass
class MultiLevelConfig:
    enabled: bool = opt(False, "V-cycle multi-level training (accellib.train runs it with techniques/vcycle.py)")
    levels: int = opt(2, "K: number of levels (2 = large + one coalesced model)", min=2, max=5)
    alpha: float = opt(0.25, "interpolation weight of the de-coalesced model (paper GPT: 0.25)", min=0.0, max=1.0)
    warm_frac: float = opt(0.05, "steps of each down-leg stage (warm the model), fraction of train.steps",
                           min=0.0, max=1.0)
    small_frac: float = opt(0.5, "steps of the smallest model, fraction of train.steps", min=0.0, max=10.0)
    up_frac: float = opt(0.25, "steps of intermediate up-leg stages (levels >= 3), fraction of train.steps",
                         min=0.0, max=10.0)
    final_frac: float = opt(0.5, "steps of the final large stage, fraction of train.steps", min=0.0, max=10.0)
    small_lr_mult: float = opt(4.0, "peak LR of level k = optim.lr * small_lr_mult**k", min=0.0, max=100.0)
    rewarm_steps: int = opt(0, "linear LR re-warm-up at the start of every stage after the first", min=0)
    factor: int = opt(2, "reduction per level (2 = half width, half depth)", min=2, max=4)
    width: bool = opt(True, "coalesce width (heads, FFN, embeddings)")
    depth: bool = opt(True, "coalesce depth (groups of blocks)")
    width_pairing: str = opt("half", "half: head h with h+H/2, i.e. unit j with j+d/2 (the paper's F = [I/2, I/2]^T, "
                             "and the official code); adjacent: head 2h with 2h+1", choices=list(PAIRINGS))
    depth_pairing: str = opt("adjacent", "adjacent: block 2i with 2i+1 (paper, official default); half: block i "
                             "with i+L/2 (the official L6-H6.json)", choices=list(PAIRINGS))

    def validate(self) -> None:
        if not (self.width or self.depth):
            raise ValueError("set multilevel.width or multilevel.depth to true (nothing to coalesce)")

    def level_map(self) -> LevelMap:
        return LevelMap(self.factor, self.width, self.depth, self.width_pairing, self.depth_pairing)


@register
class MultiLevel(Technique):
    """Config section `multilevel`. The V-cycle trains several models in sequence, so it is driven
    by `accellib.drivers.vcycle.run_vcycle` (one Trainer per stage), not from inside a Trainer."""
    name = "multilevel"
    kinds = ("gpt", "mlm", "vit")
    needs = "transformer blocks (the coalescing maps are written for them)"
    Config = MultiLevelConfig

    def fsdp_refusal(self) -> str:
        return "the V-cycle coalesces and interpolates whole weight tensors between models of different sizes"

    def setup(self, trainer) -> None:
        raise ConfigError("multilevel.enabled=true runs several models in sequence: start it with "
                          "`python -m accellib.train --config ... --out ...` (or run_vcycle())")
