"""The hardware and the per-step cost terms of the training-time planner (accellib.analysis.planner).

Steps 2-7 of our reconstruction of Lamy-Poirier 2021 (arXiv 2106.02679, §3-§5): compute at a kernel
efficiency, pipeline bubble, data-parallel reduction and its exposed part, ZeRO-3 parameter gathers,
pipeline point-to-point traffic, tensor-parallel all-reduces and memory per GPU. Every formula is ours
unless its docstring cites a source. `Costs` switches the terms that were added later (point-to-point
traffic, ZeRO-3 gathers, kernel efficiency), so each one's effect can be shown alone; `Costs.none()`
gives the model without them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.options import ConfigError


# ----------------------------------------------------------------------------- hardware and cost switches
class PlannerError(ConfigError):
    """A bad planner argument, or no configuration that fits; printed as one line."""


@dataclass
class Cluster:
    peak: float = 312e12       # FLOP/s per GPU (A100 bf16)
    eta: float = 0.5           # achieved fraction at large GEMMs (the ceiling of the kernel-efficiency curve)
    bw_dp: float = 25e9        # bytes/s per GPU on the data-parallel link (200 Gb/s InfiniBand)
    bw_pp: float = 25e9        # bytes/s per GPU on the pipeline link (stages sit in different nodes, same fabric)
    bw_tp: float = 300e9       # bytes/s per GPU inside a node (NVLink)
    memory: float = 80e9       # bytes per GPU
    beta: int = 2              # bytes per element (bf16)
    seq: int = 2048
    gemm_half: float = 2.0 ** 17   # b s d / n_t at which the kernel efficiency is half its ceiling (assumed)


P2P_MODES = ("exposed", "overlapped", "off")


@dataclass(frozen=True)
class Costs:
    """Which of the later-added step-time terms are counted; `Costs.none()` is the model without them.
    p2p: "exposed" (every activation message waits on the link: an upper bound), "overlapped" (sends run
    beside compute, only the hops on the critical path count: a lower bound) or "off";
    p2p_tp_split: each of the n_t tensor ranks sends 1/n_t of a message (Megatron's scatter/gather,
    Narayanan et al. 2021, arXiv 2104.04473, §4.1); zero3_gathers: ZeRO-3 parameter all-gathers and their
    two gathered-layer buffers; kernel_efficiency: eta_k falls as the per-GPU GEMM shrinks."""
    p2p: str = "exposed"
    p2p_tp_split: bool = False
    zero3_gathers: bool = True
    kernel_efficiency: bool = True

    def __post_init__(self):
        if self.p2p not in P2P_MODES:
            raise PlannerError(f"Costs.p2p must be one of {P2P_MODES}, got {self.p2p!r}")

    @staticmethod
    def none() -> "Costs":
        return Costs(p2p="off", zero3_gathers=False, kernel_efficiency=False)


# ----------------------------------------------------------------------------- steps 2-7
def kernel_efficiency(b: int, d: int, n_t: int, cl: Cluster) -> float:
    """Kernel efficiency eta_k = eta x / (x + x_half), x = b s d / n_t: a saturating function of the
    tokens per micro-batch times the per-GPU width. A micro-batch's GEMMs are
    (b s) rows by d / n_t columns per GPU, and small GEMMs run further below peak; eta is the large-GEMM
    ceiling. The half point `Cluster.gemm_half` = 2^17 is assumed, not measured: it puts b = 1 at
    d / n_t = 512 (the 1e10 plans at n_t = 8) at 0.89 eta. This is not `min_efficiency`, which is a floor
    on the whole step's useful fraction that the search enforces."""
    x = b * cl.seq * d / n_t
    return cl.eta * x / (x + cl.gemm_half)


def compute_time(n_params: float, tokens: float, n_gpu: int, cl: Cluster, recompute: bool = True,
                 eta: float | None = None) -> float:
    # t_comp = C_tok B / (n_gpu F eta),  C_tok = 8N with activation recomputation, else 6N
    return (8 if recompute else 6) * n_params * tokens / (n_gpu * cl.peak * (cl.eta if eta is None else eta))


def bubble(P: int, v: int, m: int, placement: str = "looped") -> float:
    """Pipeline overhead rho (idle time / compute time).
    contiguous (GPipe, 1F1B):            (P-1)/m
    looped, v stages/device, m >= P:     (P-1)/(v m)      (breadth-first or Megatron's depth-first)
    looped breadth-first, m < P:         ((P-1) + (v-1)(P-m)) / (v m)  (each loop waits for the
                                         micro-batch to come back around)"""
    if placement == "contiguous" or v == 1:
        return (P - 1) / m
    if m >= P:
        return (P - 1) / (v * m)
    return ((P - 1) + (v - 1) * (P - m)) / (v * m)


def allreduce_time(n_bytes: float, n: int, bw: float) -> float:
    # ring all-reduce: 2 (n-1)/n * bytes / bandwidth
    return 2 * (n - 1) / n * n_bytes / bw if n > 1 else 0.0


def exposed_dp_time(t_dp: float, t_bwd: float, m: int, n_layers: int, layered: bool,
                    t_gather: float = 0.0, t_fwd: float = 0.0) -> float:
    """Exposed part of the gradient reduction on one serial link when layer k's gradient is final
    at k * window / n_layers. Standard accumulation: window = t_bwd / m (the last micro-batch's
    backward); layered: window = t_bwd. Finish = max_k [k w/L + (L-k+1) t_dp/L], so
        exposed = max(t_dp / L, t_dp - window (1 - 1/L))
    With ZeRO-3 gathers on the same link (t_gather: all of a step's gathers, half in the forward pass of
    length t_fwd, half in the backward; each prefetched one layer ahead), the larger of two lower bounds:
        latency   exposed above + t_gather / L       (the first gather of each pass has nothing to hide behind)
        capacity  max(0, t_gather/2 - t_fwd) + max(0, t_gather/2 + t_dp - t_bwd)   (a pass outlasts its link work)
    With t_gather = 0 the capacity bound never exceeds the first line, so that formula is returned."""
    window = t_bwd if layered else t_bwd / m
    exposed = max(t_dp / n_layers, t_dp - window * (1 - 1 / n_layers))
    if not t_gather:
        return exposed
    return max(exposed + t_gather / n_layers,
               max(0.0, t_gather / 2 - t_fwd) + max(0.0, t_gather / 2 + t_dp - t_bwd))


def zero_state_bytes(n_params: float, n_d: int, n_p: int, n_t: int, stage: int) -> float:
    """Model states per GPU: 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, Adam m, v) bytes/param;
    ZeRO stage 1 shards the 12, stage 2 also the grads, stage 3 also the weights, over n_d."""
    p = n_params / (n_p * n_t)
    w, g, o = 2 * p, 2 * p, 12 * p
    o /= n_d if stage >= 1 else 1
    g /= n_d if stage >= 2 else 1
    w /= n_d if stage >= 3 else 1
    return w + g + o


def zero3_gather_bytes(n_params: float, n_d: int, n_p: int, n_t: int, m: int, layered: bool, beta: int = 2) -> float:
    """ZeRO-3 parameter all-gather traffic per GPU per step: every local layer is gathered for the
    forward and the backward of every micro-batch (2m times) in standard order, twice in layered order."""
    gathers = 2 if layered else 2 * m
    return gathers * (n_d - 1) / n_d * beta * n_params / (n_p * n_t)


def p2p_bytes(b: int, d: int, m: int, hops: int, cl: Cluster, n_t: int = 1) -> float:
    """Pipeline activation traffic the busiest GPU sends per step: b s d beta bytes per stage boundary per
    micro-batch forward and the same backward, over `hops` boundaries per micro-batch (1 contiguous, v looped;
    n_t > 1: Megatron's split of each message over the tensor ranks)."""
    return 2 * hops * m * b * cl.seq * d * cl.beta / n_t


def p2p_time(n_p: int, v: int, m: int, msg: float, t_f: float, t_b: float, mode: str) -> float:
    """Exposed pipeline point-to-point time per step for messages of `msg` seconds (one boundary, one
    micro-batch); t_f, t_b: one stage's forward / backward on one micro-batch.
    exposed:     2 v m msg             (every message of the busiest device waits on its link)
    overlapped:  2 (P-1) msg + (v-1) sum_{t = t_f, t_b} [max(0, (P-m) t + P msg) - max(0, (P-m) t)]
                 (the fill and the drain cross P-1 links; at each loop return the micro-batch comes back
                 after P hops, which the other m-1 micro-batches' work covers only in part)"""
    if n_p == 1 or mode == "off":
        return 0.0
    if mode == "exposed":
        return 2 * v * m * msg
    loop = sum(max(0.0, (n_p - m) * t + n_p * msg) - max(0.0, (n_p - m) * t) for t in (t_f, t_b))
    return 2 * (n_p - 1) * msg + (v - 1) * loop


def tp_time(n_l: int, d: int, b: int, m: int, n_p: int, n_t: int, cl: Cluster) -> float:
    # 4 all-reduces of b s d beta bytes per layer per micro-batch (2 forward, 2 backward), not overlapped
    if n_t == 1:
        return 0.0
    return 4 * (n_l // n_p) * m * allreduce_time(b * cl.seq * d * cl.beta, n_t, cl.bw_tp)


def activation_bytes(n_l: int, d: int, b: int, m: int, n_p: int, n_t: int, v_looped: bool, cl: Cluster) -> float:
    """Checkpointed layer inputs per GPU: b s d beta per layer per stored micro-batch (1F1B keeps at
    most n_p micro-batches in flight; breadth-first/layered keeps all m), plus one layer's
    recompute workspace s b d (34 + 5 a s / d) / n_t (Korthikanti et al. 2022), a = d / 128."""
    stored = m if v_looped else min(m, n_p)
    a = max(1, d // 128)
    return stored * (n_l // n_p) * b * cl.seq * d * cl.beta + cl.seq * b * d * (34 + 5 * a * cl.seq / d) / n_t
