"""The loss of 16-bit logits, eager vs compiled with the head (issue 27, item 1), on this CPU: paired and
interleaved, so both arms see the same machine load, and the ratio of each pair's times is reported.

Arms (forward + backward, bf16 autocast as on a GPU, one torch thread):
  loss, on given bf16 logits (N x V):
    chunked      accellib/models/losses.py's chunked cross-entropy: what lm_loss ran eagerly on 16-bit logits
    eager_f32    F.cross_entropy(z.float()): the naive loss it replaced (a full fp32 copy of the logits)
    compiled     the same F.cross_entropy(z.float()) under torch.compile (inductor): the upcast fused into
                 the logsumexp, no fp32 logits tensor
  head + loss, from the last block's output x (N x C): ln_f -> lm_head -> loss
    eager_head   head() then lm_loss (chunked): the GPU path before issue 27
    compiled_head  accellib.models.transformer.compiled_head_loss("inductor"): what train.compile=blocks now runs

    python benchmarks/head_loss.py                  # -> results/head_loss_cpu.json (about 2 minutes)
    python benchmarks/head_loss.py --quick --out X  # smoke run

Not a GPU number: a CPU's memory traffic and kernels differ; the GPU step time is not measured here.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from accellib.models.losses import cross_entropy  # noqa: E402
from accellib.models.transformer import compiled_head_loss, head, lm_loss  # noqa: E402
from accellib.core.records import environment, write_json  # noqa: E402


def fwd_bwd(fn, inputs):
    """Seconds of one forward + backward of fn(*inputs) -> loss."""
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fn(*inputs)
    loss.backward()
    return time.perf_counter() - t0


def paired(arms: dict, inputs, pairs: int) -> dict:
    """Each arm once per round, the order alternating between rounds; after one warm-up round (compiles).
    Returns each arm's median seconds and, for each arm after the first, the median of the per-round
    ratios arm / first arm."""
    names = list(arms)
    for n in names:
        fwd_bwd(arms[n], inputs)
    times = {n: [] for n in names}
    for r in range(pairs):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(fwd_bwd(arms[n], inputs))
    first = names[0]
    return dict(median_s={n: round(statistics.median(t), 4) for n, t in times.items()},
                ratio_to_first={n: round(statistics.median(a / b for a, b in zip(times[n], times[first])), 4)
                                for n in names[1:]},
                seconds=times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2048, help="logit rows N (B x T); the issue's check used 2048")
    ap.add_argument("--vocab", type=int, default=50_304, help="V: GPT-2's vocabulary padded to 50,304")
    ap.add_argument("--d-model", type=int, default=128, help="C of the head+loss part (the matmul is in both arms)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="N=256, V=4096, 2 pairs (smoke run)")
    ap.add_argument("--out", default=str(ROOT / "results" / "head_loss_cpu.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.vocab, args.pairs = 256, 4096, 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    N, V, C = args.rows, args.vocab, args.d_model
    y = torch.randint(V, (N,))

    z = (3 * torch.randn(N, V)).bfloat16().requires_grad_(True)
    ce = lambda t: F.cross_entropy(t.float(), y)  # noqa: E731
    loss_part = paired(dict(chunked=lambda t: cross_entropy(t, y), eager_f32=ce,
                            compiled=torch.compile(ce, backend="inductor")), (z,), args.pairs)

    ln_f, lm_head = torch.nn.LayerNorm(C), torch.nn.Linear(C, V, bias=False)
    x = torch.randn(1, N, C, requires_grad=True)
    head_part = paired(dict(eager_head=lambda h: lm_loss(head(ln_f, lm_head, h), y[None]),
                            compiled_head=lambda h: compiled_head_loss("inductor")(ln_f, lm_head, h, y[None])[1]),
                       (x,), args.pairs)

    rec = dict(what="forward+backward seconds of the loss of bf16 logits, CPU, 1 thread, paired and interleaved "
                    "(median of per-round ratios); not a GPU measurement",
               rows=N, vocab=V, d_model=C, pairs=args.pairs, loss=loss_part, head_and_loss=head_part,
               environment=environment())
    for name, part in (("loss on bf16 logits", loss_part), ("head + loss", head_part)):
        print(f"{name} ({N} x {V}):  " + "  ".join(f"{n} {s:.3f}s" for n, s in part["median_s"].items())
              + "  |  ratio to " + list(part["median_s"])[0] + ": "
              + "  ".join(f"{n} {r:.3f}" for n, r in part["ratio_to_first"].items()))
    write_json(args.out, rec)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
