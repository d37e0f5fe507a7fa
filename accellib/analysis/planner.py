"""The training-time analysis of Lamy-Poirier 2021 (arXiv 2106.02679, §3-§5) as a small calculator.

Scaling law -> critical batch -> number of steps -> time per step under a parallel configuration
(data n_d x pipeline n_p x tensor n_t). `step_time` charges, per step,

    t_step = t_comp (1 + rho) + t_tp + exposed data-parallel link time + exposed pipeline p2p time

where t_comp runs at a kernel efficiency eta_k that falls for small per-GPU GEMMs, rho is the pipeline
bubble, the data-parallel link carries the gradient reduction and, under ZeRO-3, the parameter gathers
(2m per local layer per step in standard order, 2 in layered order), and the pipeline link carries
b s d beta bytes per stage boundary per micro-batch each way (v times more boundaries when looped).
The terms live in planner_costs.py; `Costs` switches the kernel-efficiency loss, the ZeRO-3 gathers and
the point-to-point traffic on or off (`Costs.none()` is the model without them). `shortest_time`
searches the configurations and compares the baseline (contiguous pipeline + standard accumulation)
with the paper's methods (modular pipeline + layered accumulation); every `Plan` carries its GPU count
and GPU-days beside its time. The full text of the paper was not
available to us: the structure follows it, the constants are Kaplan et al. 2020 (arXiv 2001.08361,
Table 1 / §5) and McCandlish et al. 2018, and every formula is ours unless it says otherwise. The
simulator in accellib/parallel/simulate.py checks `bubble` exactly (tests/test_planner.py).

Two results that read oddly, and why (numbers without the added costs, `Costs.none()`, 80% floor):

* 1e12 parameters, improved / baseline = 0.15 under ZeRO-1 but 0.505 under ZeRO-3. Memory binds under
  ZeRO-1: the bf16 weights and gradients are not sharded over n_d (4 bytes x 1e12 / (8 n_p) = 500/n_p GB
  at n_t = 8), so both methods need a deep pipeline. A contiguous pipeline keeps its bubble (n_p - 1)/m
  inside the floor only with m several times n_p, which leaves few replicas at the critical batch: the
  baseline takes n_p = 16, m = 96, n_d = 84 (10,752 GPUs, 15.5 days; at n_p = 8 the m it needs no longer
  fits beside the 62.5 GB of states). The looped pipeline's bubble (n_p - 1)/(v m), v = 22, allows
  m = n_p = 8, so n_d = 1014 (64,896 GPUs, 2.3 days). The ratio stays near 0.15 up to 160 GB per GPU;
  once the states fit without a pipeline (ZeRO-3 shards them; or 600 GB GPUs) both methods take their
  1e10 and 1e11 shapes (n_p = 1 against 2), and the ratio is 0.505.
* The improved 1e12 plan uses 79.6 of 80 GB, while the abstract says ZeRO memory falls to "a tiny
  fraction" of the GPU. The search returns the fastest plan that fits, and under ZeRO-1 the smallest
  pipeline that fits (n_p = 8) already holds 62.7 GB of weights, gradients and sharded optimizer state,
  plus 16.9 GB of checkpointed activations; plans up to 2x slower go no lower than 48.3 GB (`plans`
  lists them all). The abstract's claim is about what full sharding allows: the
  same plan under ZeRO-3 holds 0.25 GB of model states (16 bytes x N / 64,896 GPUs) and 17.1 GB in all,
  the rest being activations, which this model keeps whole on each tensor rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from .planner_costs import (Cluster, Costs, PlannerError, activation_bytes, allreduce_time, bubble,
                            compute_time, exposed_dp_time, kernel_efficiency, p2p_bytes, p2p_time, tp_time,
                            zero3_gather_bytes, zero_state_bytes)

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


# ----------------------------------------------------------------------------- step 8
@dataclass
class Step:
    """One configuration's step: times in seconds, memory in bytes per GPU."""
    t_step: float
    t_comp: float        # compute at the kernel efficiency eta_k
    bubble: float        # pipeline idle time / compute time
    t_tp: float          # tensor-parallel all-reduces
    exposed_dp: float    # exposed data-parallel link time: gradient reduction and ZeRO-3 gathers
    t_gather: float      # ZeRO-3 gather link time (all of it; the exposed part is inside exposed_dp)
    t_p2p: float         # exposed pipeline point-to-point time
    eta_k: float
    memory: float


@dataclass
class Plan(Step):
    method: str
    n_d: int
    n_p: int
    n_t: int
    b: int
    m: int
    days: float
    efficiency: float    # ideal compute time (at the large-GEMM eta) / step time

    @property
    def n_gpu(self) -> int:
        return self.n_d * self.n_p * self.n_t

    @property
    def gpu_days(self) -> float:
        return self.n_gpu * self.days


def _is_improved(method: str) -> bool:
    if method not in ("baseline", "improved"):
        raise PlannerError(f"method must be 'baseline' or 'improved', got {method!r}")
    return method == "improved"


def step_time(n_params: float, method: str, n_d: int, n_p: int, n_t: int, b: int, m: int,
              cl: Cluster, zero: int = 1, costs: Costs = Costs()) -> Step:
    """t_step = t_comp (1 + rho) + t_tp + exposed dp (+ gathers) + exposed p2p, and the memory, of one configuration.
    baseline: contiguous pipeline (1F1B) + standard accumulation;
    improved: modular pipeline (one layer per stage, v = n_l / n_p) + layered accumulation."""
    n_l, d = shape_for(n_params)
    improved = _is_improved(method)
    v, n_loc = (n_l // n_p if improved else 1), n_l // n_p
    eta = kernel_efficiency(b, d, n_t, cl) if costs.kernel_efficiency else cl.eta
    t_comp = compute_time(n_params, n_d * m * b * cl.seq, n_d * n_p * n_t, cl, eta=eta)
    rho = bubble(n_p, v, m, "looped" if improved else "contiguous")
    t_fwd, t_bwd = t_comp * 2 / 8, t_comp * 6 / 8   # forward 2N, backward incl. recompute 6N of 8N per token
    p_loc = n_params / (n_p * n_t)
    t_dp = allreduce_time(cl.beta * p_loc, n_d, cl.bw_dp)
    t_gather = buffers = 0.0
    if zero >= 3 and costs.zero3_gathers and n_d > 1:
        t_gather = zero3_gather_bytes(n_params, n_d, n_p, n_t, m, improved, cl.beta) / cl.bw_dp
        t_dp /= 2                                   # a reduce-scatter: the gathers replace the all-gather half
        buffers = 2 * cl.beta * p_loc / n_loc       # two gathered layers (prefetch double buffer)
    exposed = exposed_dp_time(t_dp, t_bwd, m, n_loc, improved, t_gather, t_fwd) if n_d > 1 else 0.0
    msg = p2p_bytes(b, d, 1, 1, cl, n_t if costs.p2p_tp_split else 1) / 2 / cl.bw_pp
    t_p2p = p2p_time(n_p, v, m, msg, t_fwd / (v * m), t_bwd / (v * m), costs.p2p)
    t_tp = tp_time(n_l, d, b, m, n_p, n_t, cl)
    mem = zero_state_bytes(n_params, n_d, n_p, n_t, zero) + buffers + \
        activation_bytes(n_l, d, b, m, n_p, n_t, improved, cl)
    return Step(t_comp * (1 + rho) + t_tp + exposed + t_p2p, t_comp, rho, t_tp, exposed, t_gather, t_p2p, eta, mem)


def plans(n_params: float, method: str, cl: Cluster = Cluster(), max_gpus: int = 1 << 20, zero: int = 1,
          min_efficiency: float = 0.8, costs: Costs = Costs()):
    """Every configuration (n_d, n_p, n_t, b, m) at B <= B_crit that fits in memory and keeps at least
    `min_efficiency` of the GPUs' time computing (ideal t_comp at the large-GEMM eta / t_step)."""
    _is_improved(method)   # a bad method fails here, not silently as an empty search
    n_l, _ = shape_for(n_params)
    c = c_min_for(n_params)
    b_crit = critical_batch(loss_at(c))
    n_seq = max(1, round(b_crit / cl.seq))   # sequences per step at the critical batch
    for n_t in (1, 2, 4, 8):
        for n_p in [p for p in (1, 2, 4, 8, 16, 32, 64, 128) if p <= n_l and n_l % p == 0]:
            for b in (1, 2, 4, 8):
                for m in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512):
                    n_d = n_seq // (b * m)   # floor: the batch is at most B_crit
                    if n_d < 1 or n_d * n_p * n_t > max_gpus:
                        continue
                    s = step_time(n_params, method, n_d, n_p, n_t, b, m, cl, zero, costs)
                    eff = compute_time(n_params, n_d * m * b * cl.seq, n_d * n_p * n_t, cl) / s.t_step
                    if s.memory > cl.memory or eff < min_efficiency:
                        continue
                    days = steps(n_d * b * m * cl.seq, b_crit, s_min(c)) * s.t_step / 86400
                    yield Plan(**vars(s), method=method, n_d=n_d, n_p=n_p, n_t=n_t, b=b, m=m, days=days,
                               efficiency=eff)


def shortest_time(n_params: float, method: str, cl: Cluster = Cluster(), max_gpus: int = 1 << 20,
                  zero: int = 1, min_efficiency: float = 0.8, costs: Costs = Costs()) -> Plan:
    """The fastest of `plans`. Without the efficiency floor the answer degenerates: a pipeline with one
    micro-batch is never slower than fewer GPUs, only wasteful, so "shortest" must be read at a bounded
    cost (our reading of the paper's "other than the cost"; the PDF's exact criterion is an open item)."""
    best = min(plans(n_params, method, cl, max_gpus, zero, min_efficiency, costs), key=lambda p: p.days, default=None)
    if best is None:
        raise PlannerError(f"no configuration of a {n_params:.3g}-parameter model fits {cl.memory / 1e9:.0f} GB "
                           f"per GPU within {max_gpus} GPUs at {min_efficiency:.0%} efficiency; raise max_gpus or "
                           f"the ZeRO stage, or lower the floor")
    return best
