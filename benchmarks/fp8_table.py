"""The FP8 table: per Linear shape, bf16 against torchao's FP8 training recipes, compiled forward + backward.

`lowp.backend=torchao` converts a Linear only where this GPU's table shows a gain for its shape
(accellib/techniques/low_precision.py, fp8_plan). torchao's float8 README ("Performance") publishes such
tables for an H100, one per recipe, from its own roofline script (benchmarks/float8/float8_roofline.py):
FP8 adds amax and cast kernels to every call and only wins where the GEMM's saving exceeds them, so small
shapes run slower (its example (M, K, N) = (1024, 2048, 1024): 0.80x). This script measures the shapes a
run here has, on the GPU at hand, in the trainer's precision (fp32 weights under bf16 autocast):

    python benchmarks/fp8_table.py                  # CUDA + torchao: results/fp8_table_<gpu>.json
    python benchmarks/fp8_table.py --tokens 8192,16384
    python benchmarks/fp8_table.py --smoke          # the timing code on a CPU at toy scale, bf16 only

Each (M, K, N) is one nn.Linear(K, N) without bias (as torchao's microbenchmark) on an (M, K) input that needs
its gradient, so all three GEMMs run: torch.compile'd (dynamo reset before each, static shapes), `warmup`
calls, then `steps` calls timed with CUDA events (perf_counter on a CPU), queued behind a device sleep so that
the events time the device's work rather than the host's launches. The FP8 arms are the same Linear
through torchao.float8.convert_to_float8_training with Float8LinearConfig.from_recipe_name(recipe).
speedup = bf16 ms / FP8 ms. No number here is estimated: a recipe that cannot run is reported as skipped.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from accellib.core.records import command_line, write_json  # noqa: E402
from accellib.techniques.low_precision import FP8_RECIPES, table_path  # noqa: E402

GPT2_SMALL = dict(d=768, vocab=50304)
SMOKE_SHAPES = [("toy_fc", (64, 32, 48)), ("toy_proj", (64, 48, 32))]


def gpt2_small_shapes(batch_tokens: int) -> list[tuple[str, tuple[int, int, int]]]:
    """GPT-2 small's Linears as (name, (M, K, N)) at M = batch x seq tokens: attention's QKV and output
    projections, the MLP's two, and the vocabulary head (50,304 = GPT-2's 50,257 padded to a multiple of 64)."""
    d, v, m = GPT2_SMALL["d"], GPT2_SMALL["vocab"], batch_tokens
    return [("attn.c_attn", (m, d, 3 * d)), ("attn.c_proj", (m, d, d)), ("mlp.c_fc", (m, d, 4 * d)),
            ("mlp.c_proj", (m, 4 * d, d)), ("lm_head", (m, d, v))]


def fp8_unavailable(device: torch.device) -> str:
    """Why torchao's FP8 recipes cannot run on `device` ('' when they can)."""
    if device.type != "cuda":
        return f"not available on {device.type}"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return f"needs FP8 tensor cores (sm_89 or newer); {torch.cuda.get_device_name(device)} has none"
    try:
        importlib.import_module("torchao.float8")
    except Exception as e:  # noqa: BLE001 - any import failure is a reason, in one line
        return f"torchao.float8 does not import ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]})"
    return ""


def _ms_per_call(fn, steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        # the device sleeps (~0.1 s, untimed) while the host queues the timed calls: the events then time the
        # kernels back to back, not the host's launch rate (a compiled small Linear can be host-bound)
        torch.cuda._sleep(200_000_000)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / steps


def _time_linear(lin: nn.Module, shape, device, steps, warmup, backend) -> float:
    """ms per compiled forward + backward of `lin` on an (M, K) bf16 input, under bf16 autocast."""
    m, k, n = shape
    torch._dynamo.reset()   # each arm compiles on its own: no shared cache entries, no automatic dynamic shapes
    f = torch.compile(lin, backend=backend, dynamic=False)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(m, n, device=device, dtype=torch.bfloat16)

    def call():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = f(x)
        y.backward(g)
        x.grad = None
        for p in lin.parameters():
            p.grad = None
    return _ms_per_call(call, steps, warmup, device)


def measure(device, shapes, recipes=FP8_RECIPES, steps: int = 50, warmup: int = 10, *,
            compile_backend: str = "inductor") -> list[dict]:
    """One row per (name, (M, K, N)) of `shapes`: {"name", "shape": [M, K, N], "bf16_ms", "fp8_ms": {recipe: ms},
    "speedup": {recipe: bf16_ms / fp8_ms}}; a recipe that cannot run here has None in both and its reason under
    "skipped"."""
    device = torch.device(device)
    why = fp8_unavailable(device) if recipes else ""
    if not why and recipes:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    rows = []
    for name, shape in shapes:
        m, k, n = shape
        torch.manual_seed(0)
        base = nn.Linear(k, n, bias=False, device=device)   # fp32 weights, as the trainer keeps them
        row = dict(name=name, shape=[m, k, n], bf16_ms=round(_time_linear(base, shape, device, steps, warmup,
                                                                          compile_backend), 4),
                   fp8_ms={}, speedup={})
        for r in recipes:
            if why:
                row["fp8_ms"][r] = row["speedup"][r] = None
                row.setdefault("skipped", {})[r] = why
                continue
            lin = convert_to_float8_training(nn.Sequential(copy.deepcopy(base)),
                                             config=Float8LinearConfig.from_recipe_name(r))
            ms = _time_linear(lin, shape, device, steps, warmup, compile_backend)
            row["fp8_ms"][r], row["speedup"][r] = round(ms, 4), round(row["bf16_ms"] / ms, 4)
        rows.append(row)
        del base
    return rows


def _torchao_from_wheels() -> None:
    """torchao from .whl/ (benchmarks/gpu_wheels.sh) into a temporary folder when it is not installed."""
    if importlib.util.find_spec("torchao") is not None:
        return
    wheels = sorted((ROOT / ".whl").glob("torchao-*.whl"))
    if wheels:
        target = tempfile.mkdtemp(prefix="fp8_table_torchao_")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                        target, str(wheels[-1])], check=True)
        sys.path.insert(0, target)
        importlib.invalidate_caches()


def _print(rows: list[dict]) -> None:
    for r in rows:
        fp8 = "  ".join(f"{k} {r['fp8_ms'][k]} ms ({r['speedup'][k]}x)" if r["speedup"][k] is not None
                        else f"{k}: {r['skipped'][k]}" for k in r["fp8_ms"])
        print(f"{r['name']:>12}  (M, K, N) = {tuple(r['shape'])}  bf16 {r['bf16_ms']} ms  {fp8}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the timing code on a CPU at toy scale, bf16 only "
                                                        "(aot_eager backend); prints, writes nothing")
    ap.add_argument("--tokens", default="16384", help="comma-separated M values, tokens per micro-batch "
                                                      "(default 16384 = 16 x 1024, gpu_check's batch)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default=None, help="the JSON's path (default results/fp8_table_<gpu>.json)")
    args = ap.parse_args(argv)
    if args.smoke:
        rows = measure("cpu", SMOKE_SHAPES, steps=3, warmup=1, compile_backend="aot_eager")
        _print(rows)
        return 0
    if torch.cuda.is_available():
        _torchao_from_wheels()
    why = fp8_unavailable(torch.device("cuda")) if torch.cuda.is_available() else "no CUDA GPU here"
    if why:
        print(f"fp8_table: needs a CUDA GPU with FP8 tensor cores and torchao ({why}; bash benchmarks/gpu_wheels.sh "
              "fetches torchao into .whl/); --smoke runs the timing code on this CPU")
        return 1
    gpu = torch.cuda.get_device_name(0)
    shapes = [s for m in (int(t) for t in args.tokens.split(",")) for s in gpt2_small_shapes(m)]
    t0 = time.perf_counter()
    rows = measure("cuda", shapes, steps=args.steps, warmup=args.warmup)
    out = Path(args.out) if args.out else table_path(gpu)
    import torchao
    write_json(out, dict(gpu=gpu, torch=torch.__version__, torchao=getattr(torchao, "__version__", "unknown"),
                         precision="fp32 weights, bf16 autocast, bf16 input; forward + backward, torch.compile "
                                   "(inductor), CUDA events behind a device sleep", steps=args.steps, warmup=args.warmup,
                         seconds=round(time.perf_counter() - t0, 1),
                         command=command_line("benchmarks/fp8_table.py", list(sys.argv[1:] if argv is None else argv),
                                              ROOT), rows=rows))
    _print(rows)
    print(f"fp8_table: wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
