"""The training-time analysis of Lamy-Poirier 2021 (arXiv 2106.02679, §3-§5) as a small calculator.

Scaling law -> critical batch -> number of steps -> time per step under a parallel configuration
(data n_d x pipeline n_p x tensor n_t), with the pipeline bubble, the exposed data-parallel
communication, tensor-parallel traffic and ZeRO memory. `shortest_time` searches the configurations
and compares the baseline (contiguous pipeline + standard accumulation) with the paper's methods
(modular pipeline + layered accumulation). The full text of the paper was not available to us: the
structure follows it, the constants are Kaplan et al. 2020 (arXiv 2001.08361, Table 1 / §5) and
McCandlish et al. 2018, and every formula below is ours unless it says otherwise
(our reading of Lamy-Poirier 2021, §3). The simulator in accellib/parallel/simulate.py checks
`bubble` exactly (tests/test_planner.py).
"""
from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------- step 1: scaling law
PF_DAY = 8.64e19   # FLOPs in one PF-day


def c_min_for(n_params: float) -> float:
    """Compute-efficient budget (PF-days) whose optimal model has n_params: N = 1.3e9 C^0.73."""
    return (n_params / 1.3e9) ** (1 / 0.73)


def loss_at(c_min: float) -> float:
    # L(C_min) = (3.1e8 / C_min)^0.050  nats
    return (3.1e8 / c_min) ** 0.050


def critical_batch(loss: float) -> float:
    # B_crit(L) = 2e8 / L^(1/0.21)  tokens
    return 2e8 / loss ** (1 / 0.21)


def s_min(c_min: float) -> float:
    # S_min = 5.4e3 C_min^0.03
    return 5.4e3 * c_min ** 0.03


def steps(batch: float, b_crit: float, smin: float) -> float:
    # S(B) = S_min (1 + B_crit / B)   (McCandlish et al. 2018); S(B_crit) = 2 S_min
    return smin * (1 + b_crit / batch)


def shape_for(n_params: float, aspect: int = 128) -> tuple[int, int]:
    """(n_layer, d_model) with N = 12 n_l d^2 and d = aspect * n_l (GPT-3 175B has 12288/96 = 128)."""
    n_l = max(1, round((n_params / (12 * aspect ** 2)) ** (1 / 3)))
    n_l = n_l if n_l <= 16 else 16 * round(n_l / 16)   # a multiple of 16, so pipelines divide it
    return n_l, aspect * n_l


# ----------------------------------------------------------------------------- hardware
@dataclass
class Cluster:
    peak: float = 312e12       # FLOP/s per GPU (A100 bf16)
    eta: float = 0.5           # achieved fraction at large GEMMs
    bw_dp: float = 25e9        # bytes/s per GPU on the data-parallel link (200 Gb/s InfiniBand)
    bw_tp: float = 300e9       # bytes/s per GPU inside a node (NVLink)
    memory: float = 80e9       # bytes per GPU
    beta: int = 2              # bytes per element (bf16)
    seq: int = 2048


# ----------------------------------------------------------------------------- steps 2-7
def compute_time(n_params: float, tokens: float, n_gpu: int, cl: Cluster, recompute: bool = True) -> float:
    # t_comp = C_tok B / (n_gpu F eta),  C_tok = 8N with activation recomputation, else 6N
    return (8 if recompute else 6) * n_params * tokens / (n_gpu * cl.peak * cl.eta)


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


def exposed_dp_time(t_dp: float, t_bwd: float, m: int, n_layers: int, layered: bool) -> float:
    """Exposed part of the gradient reduction on one serial link when layer k's gradient is final
    at k * window / n_layers. Standard accumulation: window = t_bwd / m (the last micro-batch's
    backward); layered: window = t_bwd. Finish = max_k [k w/L + (L-k+1) t_dp/L], so
        exposed = max(t_dp / L, t_dp - window (1 - 1/L))"""
    window = t_bwd if layered else t_bwd / m
    return max(t_dp / n_layers, t_dp - window * (1 - 1 / n_layers))


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


# ----------------------------------------------------------------------------- step 8
@dataclass
class Plan:
    method: str
    n_d: int
    n_p: int
    n_t: int
    b: int
    m: int
    t_step: float
    days: float
    memory: float
    bubble: float
    exposed_dp: float
    efficiency: float   # ideal compute time / step time

    @property
    def n_gpu(self) -> int:
        return self.n_d * self.n_p * self.n_t


def step_time(n_params: float, method: str, n_d: int, n_p: int, n_t: int, b: int, m: int,
              cl: Cluster, zero: int = 1) -> tuple[float, float, float, float]:
    """(t_step, bubble, exposed dp time, memory) of one configuration.
    baseline: contiguous pipeline (1F1B) + standard accumulation;
    improved: modular pipeline (one layer per stage, v = n_l / n_p) + layered accumulation."""
    n_l, d = shape_for(n_params)
    improved = method == "improved"
    tokens = n_d * m * b * cl.seq
    n_gpu = n_d * n_p * n_t
    t_comp = compute_time(n_params, tokens, n_gpu, cl)
    rho = bubble(n_p, n_l // n_p if improved else 1, m, "looped" if improved else "contiguous")
    t_bwd = t_comp * 6 / 8  # backward incl. recompute: 6N of the 8N per token
    t_dp = allreduce_time(cl.beta * n_params / (n_p * n_t), n_d, cl.bw_dp)
    exposed = exposed_dp_time(t_dp, t_bwd, m, n_l // n_p, improved) if n_d > 1 else 0.0
    mem = zero_state_bytes(n_params, n_d, n_p, n_t, zero) + \
        activation_bytes(n_l, d, b, m, n_p, n_t, improved, cl)
    t = t_comp * (1 + rho) + tp_time(n_l, d, b, m, n_p, n_t, cl) + exposed
    return t, rho, exposed, mem


def shortest_time(n_params: float, method: str, cl: Cluster = Cluster(), max_gpus: int = 1 << 20,
                  zero: int = 1, min_efficiency: float = 0.8) -> Plan:
    """Search (n_d, n_p, n_t, b, m) at B <= B_crit for the shortest training time among the
    configurations that keep at least `min_efficiency` of the GPUs' time computing (t_comp / t_step).
    Without such a floor the answer degenerates: a pipeline with one micro-batch is never slower
    than fewer GPUs, only wasteful, so "shortest" must be read at a bounded cost (our reading of the
    paper's "other than the cost"; the PDF's exact criterion is an open item)."""
    n_l, d = shape_for(n_params)
    c = c_min_for(n_params)
    b_crit = critical_batch(loss_at(c))
    n_seq = max(1, round(b_crit / cl.seq))   # sequences per step at the critical batch
    best = None
    for n_t in (1, 2, 4, 8):
        for n_p in [p for p in (1, 2, 4, 8, 16, 32, 64, 128) if p <= n_l and n_l % p == 0]:
            for b in (1, 2, 4, 8):
                for m in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512):
                    n_d = n_seq // (b * m)   # floor: the batch is at most B_crit
                    if n_d < 1 or n_d * n_p * n_t > max_gpus:
                        continue
                    t, rho, exp, mem = step_time(n_params, method, n_d, n_p, n_t, b, m, cl, zero)
                    eff = compute_time(n_params, n_d * m * b * cl.seq, n_d * n_p * n_t, cl) / t
                    if mem > cl.memory or eff < min_efficiency:
                        continue
                    days = steps(n_d * b * m * cl.seq, b_crit, s_min(c)) * t / 86400
                    if best is None or days < best.days:
                        best = Plan(method, n_d, n_p, n_t, b, m, t, days, mem, rho, exp, eff)
    if best is None:
        raise ValueError(f"no configuration of a {n_params:.3g}-parameter model fits {cl.memory / 1e9:.0f} GB "
                         f"per GPU within {max_gpus} GPUs; raise max_gpus or the ZeRO stage")
    return best
