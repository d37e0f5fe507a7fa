"""The GPU check of issue 34: one call that leaves its record within a deadline (default 7 minutes) on one GPU.

    bash benchmarks/gpu_check.sh                                # on the GPU box: python3 and the checkout, nothing installed
    bash benchmarks/gpu_check.sh --deadline 300 --out-dir /scratch/gc     (or GPU_CHECK_DEADLINE / GPU_CHECK_OUT)
    python3 benchmarks/gpu_check.py --smoke                     # the same parts at toy scale on a CPU (tests, the image check)

It needs no install: the repository root goes on sys.path, and wheels the machine lacks (torchao, for the FP8
arm) are taken from .whl/ (benchmarks/gpu_wheels.sh fetches them on a machine with an index) into a temporary
folder. Before anything else it says in one line, exit status 1, when python3 has no torch, when torch sees no
CUDA GPU, or when Triton's helper build would fail (no C compiler, no Python.h). After that it always exits 0:
a missed target or a failed part is a verdict in the JSON and on the console, not an exit status.

What it does, most important first; the JSON (<out-dir>/gpu_check_<gpu>.json) is rewritten after every part,
atomically, so a kill at any moment leaves a whole file with every part measured so far (`finished: false`):
  environment        GPU, driver, torch (full version, e.g. +cu130), CUDA, NCCL, Triton; whether a
                     torch.compile'd function compiles and runs (Triton's C helper is built here)
  calibration        a few steps of the check's model (GPT-2 small: 12 layers, d=768, seq 1024, GPT-2's 50,257
                     ids padded to 50,304; batch 16, bf16 autocast), eager and with train.compile=blocks: seconds
                     per FLOP and the compile's seconds, from which the plan is estimated
  -- the plan is printed here: parts, steps, estimated seconds (labelled as estimates), what does not fit --
  matmul_peak        the card's measured bf16 matmul peak (8192^3, about 3 s), so every MFU is given against the
                     data sheet's peak (accellib/core/hardware.py: nanoGPT's and llm.c's convention, and our
                     target's) and against what this card reaches
  trainer_vs_plain   benchmarks/throughput.py's four loops (plain PyTorch and the trainer, compile off and on),
                     interleaved: tokens/s ratios and MFU; targets >= 45% of the data-sheet peak for the trainer
                     with compile, >= 0.97x the plain loop
  arm:<name>         baseline, pld, sbld, random_ltd, multilevel (the V-cycle), standardization_loss, and
                     lowp_fp8 (lowp.backend=torchao) when torchao imports: tokens/s over every step after the
                     warm-up (compilation happens there), MFU, peak memory, graphs compiled in the first and the
                     second half of the timed steps (any in the second half: a count that grows with the steps,
                     reported as a failure), and for the dropping techniques the realized speed-up (the part of the
                     FLOPs saving that shows up as time; goal >= 80%). Each arm's schedule is shortened to the
                     arm's length, so the average covers all of it (the JSON says how, per arm)
  profile            only when the trainer's compiled MFU missed its target: torch.profiler over a few compiled
                     steps, the top kernels by device time and the share of the wall they leave idle
  fsdp               if time remains: the baseline under Accelerate's FSDP2 on one process (a subprocess), i.e.
                     the wrapper's overhead against the baseline arm
  tutorial_text      if time remains: configs/tutorial.yaml's baseline on the real Shakespeare text (fp32, seed
                     1337) against the CPU cache results/tutorial_flops.json: the validation loss within 0.03 nats

Stopping: every part is estimated before it starts and skipped (printed, and listed in the JSON) when it
does not fit in what is left before the deadline less a margin; an arm also stops between steps at the
margin, and an alarm at half the margin stops any part. Speed and memory are the record; the arms train on
uniform random GPT-2 ids (no download), so their losses only show that training ran (ln 50257 = 10.8).
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

T_START = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "benchmarks"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

CONFIG = "configs/gpt2_small_owt.yaml"
DEADLINE_S = 420.0         # 7 minutes: a 10-minute job limit with margin
MFU_TARGET = 0.45          # of the data sheet's bf16 peak, the trainer with train.compile=blocks
RATIO_TARGET = 0.97        # trainer tokens/s / plain loop tokens/s
REALIZED_TARGET = 0.80     # time saving / FLOPs saving of a dropping technique (as on CPU)
TUTORIAL_TOL = 0.03        # nats: the tutorial run's validation loss against the CPU cache, same seed
ARMS = ("baseline", "pld", "sbld", "random_ltd", "multilevel", "standardization_loss", "lowp_fp8")
DROPPING = ("pld", "sbld", "random_ltd", "multilevel")
# what gpu_check may change in the shipped config: the data (random ids), the length of the run and what
# scales with it (warm-up, evaluation, checkpoints, log interval), the batch, and the MFU's peak. Never the
# model, the precision or train.compile: the run measured is the documented launch (tests/test_full_scale.py)
ALLOWED = ("data.path", "train.steps", "train.eval_every", "train.checkpoint_every", "train.progress",
           "optim.warmup_steps", "train.batch_size", "train.grad_accum", "train.eval_windows", "train.log_every",
           "train.peak_flops")
# the check's sizes: on the GPU, and the CPU smoke run's (a tiny model with GPT-2's vocabulary, the eager backend)
SCALE = dict(
    gpu=dict(batch=16, grad_accum=1, eval_windows=16, warmup=5, steps=60, reps=6, block=5, loop_warmup=3,
             peak_n=8192, peak_s=3.0, tutorial_steps=300, fsdp_steps=20, profile_steps=5, margin=15.0,
             n_train=4_000_000, n_val=200_000),
    smoke=dict(batch=4, grad_accum=1, eval_windows=4, warmup=2, steps=6, reps=2, block=2, loop_warmup=1,
               peak_n=256, peak_s=0.3, tutorial_steps=25, fsdp_steps=3, profile_steps=2, margin=2.0,
               n_train=100_000, n_val=10_000))
SMOKE_MODEL = ["--train.device=cpu", "--train.threads=1", "--model.n_layer=4", "--model.n_head=4",
               "--model.d_model=64", "--model.seq_len=32"]


# ----------------------------------------------------------------------------- before torch
def compiler() -> tuple[str | None, str | None]:
    """(the C compiler Triton's helper build will use, a problem): Triton takes $CC, else gcc, else clang
    (triton/runtime/build.py)."""
    cc = os.environ.get("CC")
    if cc:
        return (shutil.which(cc), None) if shutil.which(cc) else (None, f"CC={cc} is not a command; Triton would use "
                                                                        "it at the first torch.compile: install it, or unset CC")
    found = shutil.which("gcc") or shutil.which("clang")
    return (found, None) if found else (None, "no C compiler found (gcc, clang); Triton needs one at the first "
                                              "torch.compile: install gcc (e.g. apt-get install build-essential) or set CC")


def python_headers(include_dir: str | None = None) -> tuple[str | None, str | None]:
    """(the folder of Python.h that Triton's helper build includes, a problem). Triton compiles a small C
    module against this interpreter's headers (sysconfig's include path, the posix_prefix scheme for Debian's
    posix_local), so a Python without its -dev package fails at the first compile, minutes into a run."""
    if include_dir is None:
        scheme = sysconfig.get_default_scheme()
        include_dir = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
    if (Path(include_dir) / "Python.h").is_file():
        return include_dir, None
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    return None, (f"Python.h is missing from {include_dir}; Triton builds a C helper against it at the first "
                  f"torch.compile: install python{v}-dev (Debian/Ubuntu: apt-get install python{v}-dev; "
                  f"RHEL: dnf install python{v.replace('.', '')}-devel)")


def preflight(smoke: bool) -> str | None:
    """The one-line reason the check cannot start here, or None. Tells "no torch" from "no GPU"."""
    try:
        import torch
    except ImportError as e:
        return (f"{sys.executable} (Python {sys.version.split()[0]}) has no torch ({e}); run the check with the "
                "Python that has it: PYTHON=/path/to/python3 bash benchmarks/gpu_check.sh")
    if smoke:
        return None
    if not torch.cuda.is_available():
        build = (f"a CPU-only build of torch ({torch.__version__})" if torch.version.cuda is None else
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU or driver: see nvidia-smi")
        return (f"no CUDA GPU is visible to torch (torch.cuda.is_available() is False): {build}; run it on a "
                "machine with an NVIDIA GPU, or try --smoke on a CPU")
    for problem in (compiler()[1], python_headers()[1]):
        if problem:
            return problem
    return None


# ----------------------------------------------------------------------------- the record and the clock
class Deadline(BaseException):
    """The alarm at the deadline (less half the margin) went off during a part (a BaseException, so that no
    `except Exception` inside torch swallows it)."""


class Clock:
    """Seconds since the process started, against the deadline less a margin kept for the summary."""

    def __init__(self, deadline_s: float, margin_s: float):
        self.deadline, self.margin, self.expired, self.in_part = deadline_s, margin_s, False, False

    def elapsed(self) -> float:
        return time.monotonic() - T_START

    def left(self) -> float:
        """Seconds left for work: to the deadline, less the margin."""
        return self.deadline - self.margin - self.elapsed()

    def fits(self, seconds: float) -> bool:
        return not self.expired and seconds <= self.left()

    def arm_alarm(self):
        """SIGALRM at the deadline less half the margin: the clock expires, and a part that is running is stopped
        (Deadline raised inside it). Returns the previous handler and timer (disarm() puts them back)."""
        def ring(signum, frame):
            self.expired = True
            if self.in_part:
                raise Deadline()
        self._old = (signal.signal(signal.SIGALRM, ring),
                     signal.setitimer(signal.ITIMER_REAL, max(0.01, self.deadline - self.margin / 2 - self.elapsed())))
        return self._old

    def disarm(self) -> None:
        if getattr(self, "_old", None) is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            handler, (delay, interval) = self._old
            signal.signal(signal.SIGALRM, handler)
            if delay > 0:
                signal.setitimer(signal.ITIMER_REAL, delay, interval)
            self._old = None


class Record:
    """The check's JSON, rewritten atomically (accellib.core.records.write_json: a temp file and a rename)
    after every change, with the alarm held off while it writes: a kill leaves the last whole version."""

    def __init__(self, path: Path, head: dict):
        self.path, self.data = path, dict(head, finished=False, parts={}, arms={}, skipped={}, verdicts=[])
        self.save()

    def save(self) -> None:
        from accellib.core.records import write_json
        self.data["elapsed_s"] = round(time.monotonic() - T_START, 1)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            write_json(self.path, self.data)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def put(self, name: str, value: dict) -> None:
        if name.startswith("arm:"):
            self.data["arms"][name[4:]] = value
        else:
            self.data["parts"][name] = value
        self.save()

    def get(self, name: str) -> dict | None:
        return self.data["arms"].get(name[4:]) if name.startswith("arm:") else self.data["parts"].get(name)

    def skip(self, name: str, why: str) -> None:
        self.data["skipped"][name] = why
        print(f"gpu_check: skipped {name}: {why}", flush=True)
        self.save()

    def verdict(self, what: str, measured, target: str, passed) -> None:
        self.data["verdicts"].append(dict(what=what, measured=measured, target=target, passed=passed))
        self.save()


class Skip(Exception):
    """A part that cannot run here (e.g. its data or package is missing); the message says why."""


def run_part(name: str, est: float, fn, rec: Record, clock: Clock, force: bool = False) -> dict | None:
    """Run one part if it fits before the deadline (`force`: whatever the clock says); its result (or its failure,
    in one line, or the deadline cutting it) goes into the JSON at once."""
    if clock.expired:
        rec.skip(name, "the deadline came during an earlier part")
        return None
    if not force and not clock.fits(est):
        rec.skip(name, f"estimated {est:.0f} s (an estimate), {max(0.0, clock.left()):.0f} s left before the "
                       f"deadline's {clock.margin:.0f} s margin")
        return None
    print(f"gpu_check: [{clock.elapsed():5.0f} s] {name} (estimated {est:.0f} s)", flush=True)
    t0 = time.monotonic()
    try:
        clock.in_part = True
        try:
            out = fn()
        finally:
            clock.in_part = False
    except Deadline:
        clock.expired = True
        rec.put(name, dict(status="cut", reason="the deadline came during this part",
                           seconds=round(time.monotonic() - t0, 1), estimated_s=round(est, 1)))
        print(f"gpu_check: {name} cut by the deadline", flush=True)
        return None
    except Skip as e:
        rec.skip(name, str(e))
        return None
    except Exception as e:
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        rec.put(name, dict(status="failed", error=f"{type(e).__name__}: {first}",
                           seconds=round(time.monotonic() - t0, 1), estimated_s=round(est, 1)))
        print(f"gpu_check: {name} FAILED: {type(e).__name__}: {first}", flush=True)
        free_memory()
        return None
    out = dict(status=out.pop("status", "done"), **out, seconds=round(time.monotonic() - t0, 1),
               estimated_s=round(est, 1))
    rec.put(name, out)
    return out


def free_memory() -> None:
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_plan(estimates: list[tuple[str, float]], budget_s: float) -> tuple[list, list]:
    """Which parts, in order, fit in `budget_s` seconds by their estimates: (planned [(name, est, cumulative)],
    left out [(name, est)]). A part that does not fit is left out and the later, smaller ones still may fit."""
    planned, left_out, total = [], [], 0.0
    for name, est in estimates:
        if total + est <= budget_s:
            total += est
            planned.append((name, est, total))
        else:
            left_out.append((name, est))
    return planned, left_out


# ----------------------------------------------------------------------------- the check's configs
def base_overrides(args, data_dir: Path) -> list[str]:
    """The overrides of configs/gpt2_small_owt.yaml every trainer of the check runs with (ALLOWED keys only,
    and the smoke run's tiny CPU model): train.steps = warm-up + args.steps; one log window per warm-up."""
    sc = SCALE["smoke" if args.smoke else "gpu"]
    warm = getattr(args, "warmup", None) or sc["warmup"]
    total = warm + args.steps
    over = [f"--data.path={data_dir}", f"--train.steps={total}", "--train.eval_every=0",
            "--train.checkpoint_every=0", "--train.progress=false", f"--optim.warmup_steps={max(1, total // 10)}",
            f"--train.batch_size={sc['batch']}", f"--train.grad_accum={sc['grad_accum']}",
            f"--train.eval_windows={sc['eval_windows']}", f"--train.log_every={warm}"]
    if args.peak_flops:
        over.append(f"--train.peak_flops={args.peak_flops:g}")
    if args.smoke:
        over += SMOKE_MODEL + [f"--train.compile_backend={getattr(args, 'compile_backend', None) or 'eager'}"]
    return over


def arm_overrides(total: int, seq_len: int) -> dict[str, tuple[list[str], str]]:
    """Each arm's overrides on top of the shared ones, and how its schedule is fitted to the `total` steps."""
    g = 5 / total
    return {
        "baseline": ([], "no schedule"),
        "pld": (["--pld.enabled=true", "--pld.theta_bar=0.5", f"--pld.gamma={g:g}"],
                f"theta(t) decays at gamma = 5/{total}: from 1 at step 0 to theta_bar 0.5 + 0.5 e^-5 at step {total} "
                "(the paper's 0.001 suits 100K steps)"),
        "sbld": (["--sbld.enabled=true", "--sbld.theta_bar=0.5", f"--sbld.gamma={g:g}"],
                 f"profiles at step max(2%, min(100, T/5)) of T = {total} (its cost counted), then PLD's theta(t) "
                 f"at gamma = 5/{total}"),
        "random_ltd": (["--random_ltd.enabled=true", f"--random_ltd.min_len={max(1, seq_len // 8)}",
                        f"--random_ltd.step_len={max(1, seq_len // 64)}"],
                       f"kept length ramps from seq_len/8 to seq_len over 60% of the {total} steps (ramp_steps=0)"),
        # the V-cycle coalesces an untied head: this arm's model has the head as its own matrix
        "multilevel": (["--multilevel.enabled=true", "--model.tie_head=false", "--multilevel.warm_frac=0.2"],
                       f"V-cycle stages of 20% / 50% / 50% of the {total} steps (warm, half-size, final), each "
                       "stage's first log window (its compilation) left out of the average; untied head"),
        "standardization_loss": (["--standardization_loss.enabled=true", "--standardization_loss.weight=1e-4"],
                                 "no schedule"),
        "lowp_fp8": (["--lowp.enabled=true", "--lowp.backend=torchao"], "no schedule"),
    }


class Check:
    """What the parts share: the arguments, the device, the data, the record, the clock, the calibration."""

    def __init__(self, args, rec: Record, clock: Clock):
        import torch
        self.args, self.rec, self.clock, self.torch = args, rec, clock, torch
        self.sc = SCALE["smoke" if args.smoke else "gpu"]
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.gpu = "cpu" if args.smoke else torch.cuda.get_device_name(0)
        self.runs = Path(args.runs)
        self.data_dir = None
        self.cal: dict = {}
        self.peak_measured = None
        self.correction = 1.0   # measured / estimated seconds of the last arm, applied to the next arms' estimates

    # ---- configs and data
    def data(self) -> Path:
        if self.data_dir is None:
            from throughput import write_gpt2_tokens
            self.data_dir = write_gpt2_tokens(self.runs / "data", self.sc["n_train"], self.sc["n_val"])
        return self.data_dir

    def total_steps(self) -> int:
        return self.sc["warmup"] + self.args.steps

    def config(self, arm: str = "baseline", extra: list[str] = ()):
        from accellib.core.config import load_config
        over = base_overrides(self.args, rel(self.data()))
        over += arm_overrides(self.total_steps(), 32 if self.args.smoke else 1024)[arm][0] + list(extra)
        return load_config(ROOT / CONFIG, over)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def peaks(self) -> dict:
        """The peaks an MFU is given against: the data sheet's (None on a CPU or an unlisted GPU) and the
        measured matmul's (None until matmul_peak ran; the smoke run's fp32)."""
        from accellib.core.hardware import table_peak
        sheet = self.args.peak_flops or (None if self.args.smoke else table_peak(self.gpu, "bf16"))
        return dict(datasheet=sheet, measured=self.peak_measured)

    def mfu(self, flops: float, seconds: float) -> dict:
        rate = flops / seconds if seconds > 0 else float("nan")
        return {k: (round(rate / p, 5) if p else None) for k, p in self.peaks().items()}

    def reset_compiler(self) -> None:
        """A fresh dynamo for the next trainer: its graph counts are its own, and no earlier trainer's cache
        entries count against torch's recompile limit (inductor's on-disk caches stay warm)."""
        import torch._dynamo
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        free_memory()
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats()

    # ---- the measurement shared by the arms and the FSDP worker
    def time_trainer(self, tr, warmup: int, steps: int) -> dict:
        """Warm-up steps (compilation happens there), then `steps` timed steps, device-synchronised at both ends of
        the timed run only. Graphs compiled are counted on the host after the warm-up, at half and at the end of
        the timed steps; the arm stops early (and says so) when the deadline's margin is reached."""
        from accellib.core.hardware import peak_memory_gb
        from torch._dynamo.utils import counters
        graphs = lambda: counters["stats"]["unique_graphs"]  # noqa: E731
        t0 = time.perf_counter()
        for _ in range(warmup):
            loss = tr.train_step()
        self.sync()
        float(loss)
        warm_s = time.perf_counter() - t0
        st = tr.state
        tok0, fl0, g0, g_mid = st.tokens, st.flops, graphs(), None
        done, cut = 0, False
        t0 = time.perf_counter()
        for i in range(steps):
            if self.clock.left() <= 0:
                cut = True
                break
            loss = tr.train_step()
            done += 1
            if done == max(1, steps // 2):
                g_mid = graphs()
        self.sync()
        last = float(loss)
        wall = time.perf_counter() - t0
        g_mid = graphs() if g_mid is None else g_mid
        tokens, flops = st.tokens - tok0, st.flops - fl0
        return dict(warmup_steps=warmup, warmup_s=round(warm_s, 2), timed_steps=done, planned_steps=steps,
                    cut_by_deadline=cut, wall_s=round(wall, 3), tokens=tokens, flops=flops,
                    tok_per_s=round(tokens / wall, 1) if wall > 0 and done else None,
                    flops_per_token=flops / tokens if tokens else None,
                    mfu=self.mfu(flops, wall) if done else None,
                    peak_mem_gb=round(peak_memory_gb(self.device), 3),
                    graphs=dict(after_warmup=g0, first_half=g_mid - g0, second_half=graphs() - g_mid),
                    final_train_loss=round(last, 4))


def rel(p: Path) -> Path:
    """`p` relative to the repository when inside it (the records hold no machine paths)."""
    p = Path(p).resolve()
    return p.relative_to(ROOT) if p.is_relative_to(ROOT) else p


# ----------------------------------------------------------------------------- wheels carried in .whl/
def setup_torchao(whl_dir: Path, target_root: Path) -> dict:
    """torchao for the FP8 arm: the installed one, else the wheels in `whl_dir` installed into a temporary
    folder (`pip install --no-index --no-deps --target`, or unzipped when this Python has no pip) that goes on
    sys.path. Returns what was found and, when torchao is not usable, the one-line reason."""
    import importlib
    import importlib.util
    info = dict(source=None, version=None, reason=None)
    wheels = sorted(whl_dir.glob("torchao-*.whl")) if whl_dir.is_dir() else []
    if importlib.util.find_spec("torchao") is not None:
        info["source"] = "installed"
    elif wheels:
        target = Path(tempfile.mkdtemp(prefix="wheels_", dir=target_root))
        atexit.register(shutil.rmtree, target, True)
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target", str(target),
               *map(str, wheels)]
        has_pip = importlib.util.find_spec("pip") is not None
        p = subprocess.run(cmd, capture_output=True, text=True) if has_pip else None
        if p is None or p.returncode != 0:  # no pip here, or it refused: a wheel is a zip of the files to import
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    z.extractall(target)
        sys.path.insert(0, str(target))
        importlib.invalidate_caches()
        info["source"] = f"{rel(whl_dir)}/{wheels[-1].name} ({'pip --target' if p is not None and p.returncode == 0 else 'unzipped'})"
    else:
        info["reason"] = ("torchao is not installed and .whl/ holds no torchao wheel (run bash benchmarks/gpu_wheels.sh "
                          "on a machine with a package index and copy .whl/ into the checkout here)")
        return info
    try:
        import torchao
        info["version"] = getattr(torchao, "__version__", "unknown")
    except Exception as e:
        info["reason"] = f"torchao does not import here ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"
    return info


# ----------------------------------------------------------------------------- the parts
def part_environment(c: Check) -> dict:
    from accellib.core.records import environment
    torch = c.torch
    out = dict(environment())
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    cc, headers = compiler()[0], python_headers()[0]
    out["compiler"] = cc and Path(cc).name                           # names, not this machine's paths
    out["python_headers"] = "found" if headers else None
    if c.device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory_gb=round(p.total_memory / 1e9, 1),
                   multiprocessors=p.multi_processor_count, bf16=torch.cuda.is_bf16_supported())
    # does a torch.compile'd function compile and run here (on a GPU: inductor -> Triton, whose C helper is built now)
    backend = c.args.compile_backend or ("eager" if c.args.smoke else "inductor")
    t0 = time.perf_counter()
    try:
        f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1, backend=backend, dynamic=False)
        x = torch.randn(4096, device=c.device)
        ok = bool(torch.allclose(f(x), torch.nn.functional.gelu(x) * 2 + 1, atol=1e-5))
        out["compile_probe"] = dict(backend=backend, ok=ok, seconds=round(time.perf_counter() - t0, 2))
    except Exception as e:
        out["compile_probe"] = dict(backend=backend, ok=False, seconds=round(time.perf_counter() - t0, 2),
                                    error=f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")
    out["torchao"] = setup_torchao(ROOT / ".whl", c.runs)
    return out


def part_calibration(c: Check) -> dict:
    """A few steps of the check's model, eager and compiled: the seconds per FLOP and the compile's seconds that
    the plan's estimates scale from (the smoke run of the plan, on this device)."""
    from accellib.core.trainer import Trainer
    out = {}
    for mode in ("none", "blocks"):
        c.reset_compiler()
        cfg = c.config("baseline", [f"--train.compile={mode}"]) if mode == "none" else c.config("baseline")
        t0 = time.perf_counter()
        tr = Trainer(cfg)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        float(tr.train_step())
        first = time.perf_counter() - t0
        n = 2
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            loss = tr.train_step()
        float(loss)
        step = (time.perf_counter() - t0) / n
        flops = tr.task.micro_flops(None) * cfg.train.grad_accum
        out[mode] = dict(build_s=round(build, 3), first_step_s=round(first, 3), step_s=round(step, 4),
                         host_step_s=round((time.process_time() - cpu0) / n, 4), flops_per_step=flops,
                         s_per_flop=step / flops, compile_s=round(max(0.0, first - step), 3))
        c.flops_per_step = flops
        tr.accelerator.free_memory()
        del tr
    c.reset_compiler()
    c.cal = out
    return dict(out, note="a few steps of the check's model on this device; the plan's estimates scale these by FLOPs")


def part_matmul_peak(c: Check) -> dict:
    from accellib.core.hardware import measure_matmul_flops
    torch = c.torch
    dtype = torch.float32 if c.args.smoke else torch.bfloat16
    m = measure_matmul_flops(c.device, dtype, c.sc["peak_n"], c.sc["peak_s"])
    c.peak_measured = m["best"]
    sheet = c.peaks()["datasheet"]
    return dict(m, datasheet=sheet, best_over_datasheet=round(m["best"] / sheet, 4) if sheet else None)


def part_trainer_vs_plain(c: Check) -> dict:
    from throughput import LOOPS, measure
    c.reset_compiler()
    cfg = c.config("baseline")
    compiled = ((c.rec.get("environment") or {}).get("compile_probe") or {}).get("ok", False)
    names = LOOPS if compiled else LOOPS[:2]
    backend = cfg.train.compile_backend
    res = measure(cfg, names, c.sc["reps"], c.sc["block"], c.sc["loop_warmup"], backend)
    fl = res["flops_per_step"] * c.sc["block"]
    mfu = {k: c.mfu(fl, sorted(v)[len(v) // 2]) for k, v in res["times"].items()}
    out = dict(loops=list(names), model=dict(n_layer=cfg.model.n_layer, d_model=cfg.model.d_model,
                                             seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size,
                                             batch=cfg.train.batch_size),
               rounds=c.sc["reps"], steps_per_block=c.sc["block"], warmup_steps=c.sc["loop_warmup"],
               compile_backend=backend, tokens_per_s={k: round(v, 1) for k, v in res["tps"].items()},
               ratios={k: round(v, 4) for k, v in res["ratios"].items()}, mfu=mfu,
               graphs_compiled_during_timing=res["recompiled"],
               method="benchmarks/throughput.py's loops, warmed up, then timed in interleaved rounds (the order "
                      "reversed every other round); a ratio is the median over rounds of the per-round ratio")
    if not compiled:
        out["left_out"] = "the compiled loops: the compile probe failed (environment.compile_probe)"
    res["trainer"].accelerator.free_memory()
    del res
    c.reset_compiler()
    return out


def part_arm(c: Check, arm: str) -> dict:
    from accellib.core.trainer import Trainer
    over, schedule = arm_overrides(c.total_steps(), 32 if c.args.smoke else 1024)[arm]
    c.reset_compiler()
    cfg = c.config(arm)
    if arm == "multilevel":
        return dict(overrides=over, schedule=schedule, **vcycle_arm(c, cfg))
    tr = Trainer(cfg)
    m = c.time_trainer(tr, c.sc["warmup"], c.args.steps)
    tr.accelerator.free_memory()
    del tr
    c.reset_compiler()
    g = m["graphs"]
    m["recompiles"] = ("ok: none after the first half of the timed steps" if g["second_half"] == 0 else
                       f"FAILED: {g['second_half']} graph(s) compiled in the second half of the timed steps")
    return dict(overrides=over, schedule=schedule, **m)


def vcycle_arm(c: Check, cfg) -> dict:
    """The V-cycle through its own driver (accellib/drivers/vcycle.py), one Trainer per stage, in a scratch run
    folder; tokens/s from its metrics.jsonl windows (one per warm-up length of steps), each stage's first window
    (its compilation) left out."""
    from accellib.core.hardware import peak_memory_gb
    from accellib.core.records import read_metrics
    from accellib.drivers.vcycle import run_vcycle
    from torch._dynamo.utils import counters
    out = c.runs / "multilevel"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    run_vcycle(cfg, out)
    total_s = time.perf_counter() - t0
    recs = [r for r in read_metrics(out) if not r.get("transition")]
    stages, tokens, flops, wall = {}, 0, 0.0, 0.0
    for r in recs:
        stages.setdefault(r["stage"], []).append(r)
    per_stage = {}
    for s, rs in sorted(stages.items()):
        rs.sort(key=lambda r: r["step"])
        first, last = rs[0], rs[-1]
        dt, dtok, dfl = last["wall"] - first["wall"], last["tokens"] - first["tokens"], last["flops"] - first["flops"]
        per_stage[s] = dict(steps_timed=last["step"] - first["step"], tok_per_s=round(dtok / dt, 1) if dt > 0 else None)
        tokens, flops, wall = tokens + dtok, flops + dfl, wall + dt
    shutil.rmtree(out, ignore_errors=True)   # its checkpoints: GBs at GPT-2 size
    res = dict(tok_per_s=round(tokens / wall, 1) if wall > 0 else None, tokens=tokens, flops=flops, wall_s=round(wall, 3),
               flops_per_token=flops / tokens if tokens else None, mfu=c.mfu(flops, wall) if wall > 0 else None,
               stages=per_stage, run_s=round(total_s, 1), peak_mem_gb=round(peak_memory_gb(c.device), 3),
               graphs=dict(total=counters["stats"]["unique_graphs"]),
               recompiles="not judged: every stage builds and compiles its own model",
               final_train_loss=recs[-1]["train_loss"] if recs else None)
    c.reset_compiler()
    return res


def realized(arm: dict, base: dict) -> dict | None:
    """The part of a technique's FLOPs saving per token that shows up as time: (1 - t_arm / t_base) /
    (1 - F_arm / F_base), t = seconds per token after warm-up, F = the trainer's analytic FLOPs per token."""
    if not (arm.get("tok_per_s") and base.get("tok_per_s") and arm.get("flops_per_token") and base.get("flops_per_token")):
        return None
    f_saving = 1 - arm["flops_per_token"] / base["flops_per_token"]
    t_saving = 1 - base["tok_per_s"] / arm["tok_per_s"]
    return dict(flops_saving=round(f_saving, 4), time_saving=round(t_saving, 4),
                realized=round(t_saving / f_saving, 4) if f_saving > 1e-6 else None)


def part_profile(c: Check) -> dict:
    """torch.profiler over a few steps of the compiled baseline: the top kernels by device time, the share of
    the wall the device is idle between kernels, the graphs compiled. Run only when the MFU target was missed."""
    from torch.profiler import ProfilerActivity, profile
    from accellib.core.trainer import Trainer
    torch = c.torch
    c.reset_compiler()
    tr = Trainer(c.config("baseline"))
    for _ in range(c.sc["warmup"]):
        loss = tr.train_step()
    c.sync()
    float(loss)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.device.type == "cuda" else [])
    n = c.sc["profile_steps"]
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(n):
            loss = tr.train_step()
        c.sync()
        float(loss)
    wall = time.perf_counter() - t0
    cuda = c.device.type == "cuda"
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    # on a GPU the device's own events (kernels, copies): the CPU-side operators that launch them are left out
    ev = [e for e in prof.key_averages() if getattr(e, key, 0) > 0
          and (not cuda or e.device_type != torch.autograd.DeviceType.CPU)]
    ev.sort(key=lambda e: getattr(e, key), reverse=True)
    busy = sum(getattr(e, key) for e in ev) / 1e6
    top = [dict(name=e.key[:120], seconds=round(getattr(e, key) / 1e6, 4), share_of_wall=round(getattr(e, key) / 1e6 / wall, 4),
                calls=e.count) for e in ev[:15]]
    tr.accelerator.free_memory()
    del tr, prof
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    c.reset_compiler()
    return dict(steps=n, wall_s=round(wall, 3), kernel_seconds=round(busy, 3),
                idle_share=round(max(0.0, 1 - busy / wall), 4) if cuda else None, top=top, graphs=graphs,
                note=("self device time of every kernel; idle_share = 1 - their sum / the wall (gaps between kernels)"
                      if cuda else "CPU: self CPU time of each operator (no device timeline)"))


def part_fsdp(c: Check) -> dict:
    """The baseline under Accelerate's FSDP2 on one process, in a subprocess (a process group of one)."""
    res_path = c.runs / "fsdp_result.json"
    res_path.unlink(missing_ok=True)
    job = dict(smoke=c.args.smoke, steps=c.sc["fsdp_steps"], warmup=c.sc["warmup"], overrides=base_overrides(
        c.args, rel(c.data())), peak_measured=c.peak_measured, peak_flops=c.args.peak_flops, out=str(res_path),
        left=c.clock.left(), margin=c.clock.margin, runs=str(c.runs))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--fsdp-worker", json.dumps(job)]
    timeout = max(1.0, c.clock.left() + c.clock.margin / 4)
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Deadline() from None
    if p.returncode != 0 or not res_path.is_file():
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise RuntimeError(f"the FSDP worker exited with status {p.returncode}: {tail}")
    m = json.loads(res_path.read_text())
    base = c.rec.get("arm:baseline") or {}
    if m.get("tok_per_s") and base.get("tok_per_s"):
        m["vs_baseline_arm"] = round(m["tok_per_s"] / base["tok_per_s"], 4)
    m["what"] = ("the baseline config (train.compile=blocks) under FSDP2 on one process: one FSDP unit per Block, fp32 "
                 "all-gathers; against the baseline arm measured in the main process")
    return m


def fsdp_worker(job: dict) -> int:
    """The FSDP part's process: a process group of one, Accelerate's FSDP2 plugin as accellib builds it
    (accellib.core.launch.fsdp_plugin), the one Trainer, timed as the arms are."""
    from accellib.core.launch import _free_port
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", ACCELERATE_USE_FSDP="true", FSDP_VERSION="2")
    from accelerate import Accelerator

    from accellib.core.config import load_config
    from accellib.core.launch import _fsdp_on_cpu, fsdp_plugin, mixed_precision_for
    from accellib.core.trainer import Trainer
    args = argparse.Namespace(smoke=job["smoke"], steps=job["steps"], peak_flops=job["peak_flops"],
                              compile_backend=None, runs=job["runs"])
    clock = Clock(deadline_s=job["left"] + job["margin"] + (time.monotonic() - T_START), margin_s=job["margin"])
    c = Check.__new__(Check)
    import torch
    c.args, c.clock, c.torch, c.sc = args, clock, torch, SCALE["smoke" if job["smoke"] else "gpu"]
    c.device = torch.device("cpu" if job["smoke"] else "cuda")
    c.gpu = "cpu" if job["smoke"] else torch.cuda.get_device_name(0)
    c.peak_measured = job["peak_measured"]
    cfg = load_config(ROOT / CONFIG, job["overrides"])
    # a one-process FSDP launch shards nothing and accellib's make_accelerator refuses it for users; the check
    # wants exactly that to see the wrapper's own cost, so it builds the Accelerator as make_accelerator does
    plugin = fsdp_plugin()
    acc = Accelerator(cpu=job["smoke"], mixed_precision=mixed_precision_for(cfg.train.precision),
                      dynamo_backend="no", fsdp_plugin=plugin)
    if job["smoke"] and acc.distributed_type.value == "MULTI_CPU":
        _fsdp_on_cpu(acc, plugin)
    if not getattr(acc, "is_fsdp2", False):
        raise RuntimeError(f"Accelerate set up {acc.distributed_type.value}, not FSDP2")
    tr = Trainer(cfg, accelerator=acc)
    m = c.time_trainer(tr, job["warmup"], job["steps"])
    m["distributed_type"] = acc.distributed_type.value
    from accellib.core.records import write_json
    write_json(job["out"], m)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def part_tutorial(c: Check) -> dict:
    """configs/tutorial.yaml's baseline on the real text, fp32, against the CPU cache at the same step and seed."""
    from accellib.core.trainer import Trainer
    from accellib.train import run_config
    cache_file = ROOT / "results" / "tutorial_flops.json"
    if not (ROOT / "data" / "shakespeare" / "meta.json").is_file():
        raise Skip("data/shakespeare is not here (make data, or copy the folder from a machine that has it: 5 MB)")
    if not cache_file.is_file():
        raise Skip(f"{rel(cache_file)} is not here")
    steps = c.sc["tutorial_steps"]
    over = [f"--train.steps={steps}", "--train.progress=false", "--train.log_every=50",
            f"--train.device={c.device.type}", "--train.precision=fp32"] + (["--train.threads=1"] if c.args.smoke else [])
    c.reset_compiler()
    cfg = run_config(str(ROOT / "configs" / "tutorial.yaml"), "baseline", over)
    cache = json.loads(cache_file.read_text())
    curve = cache["curves"].get(f"baseline/seed{cfg.train.seed}", [])
    cached = next((r["val_loss"] for r in curve if r["step"] == steps and "val_loss" in r), None)
    if cached is None:
        raise Skip(f"{rel(cache_file)} has no validation loss at step {steps} for seed {cfg.train.seed}")
    t0 = time.perf_counter()
    final = Trainer(cfg).fit()
    diff = final["val_loss"] - cached
    c.reset_compiler()
    return dict(config="configs/tutorial.yaml (baseline arm)", steps=steps, seed=cfg.train.seed, precision="fp32",
                val_loss=round(final["val_loss"], 5), cpu_cache=cached, cache=str(rel(cache_file)),
                cache_torch=cache["environment"]["versions"].get("torch"), difference=round(diff, 5),
                tolerance=TUTORIAL_TOL, within=abs(diff) <= TUTORIAL_TOL, train_s=round(time.perf_counter() - t0, 1),
                note=("the first steps of the 300-step run (its LR is still warming up at step 25, so a shorter run "
                      "trains the same steps)" if steps < 300 else "the whole 300-step run"))


# ----------------------------------------------------------------------------- estimates and the plan
def estimates(c: Check, arms: list[str]) -> list[tuple[str, float, str]]:
    """(part, estimated seconds, steps) for every part after the calibration: the calibration's seconds per
    FLOP (eager or compiled) x the part's analytic FLOPs at full model size, plus a build and a compile per
    model at the calibration's measured seconds. Estimates, not measurements."""
    e, b = c.cal["none"], c.cal["blocks"]
    fl = c.flops_per_step
    build, comp = b["build_s"], b["compile_s"]
    sc, warm, steps = c.sc, c.sc["warmup"], c.args.steps
    out = [("matmul_peak", sc["peak_s"] + 1.0, "-")]  # (+ allocating and warming up the matrices)
    loop_steps = sc["loop_warmup"] + sc["reps"] * sc["block"]
    loops = (2 * loop_steps * fl * e["s_per_flop"] + 2 * loop_steps * fl * b["s_per_flop"]
             + 2 * comp + 4 * build)
    out.append(("trainer_vs_plain", loops, f"4 x {loop_steps}"))
    one = build + comp + (warm + steps) * fl * b["s_per_flop"]
    for arm in arms:
        if arm == "multilevel":
            n = round(1.2 * (warm + steps))
            est, st = 3 * (build + comp) + n * fl * b["s_per_flop"] + 3 * e["first_step_s"], f"{n} (3 stages)"
        elif arm == "sbld":
            est, st = one + 8 * fl / 3 * e["s_per_flop"], f"{warm} + {steps}"  # + its 8 profiling batches
        else:
            est, st = one, f"{warm} + {steps}"
        out.append((f"arm:{arm}", est, st))
    out.append(("profile", build + comp + (warm + sc["profile_steps"]) * fl * b["s_per_flop"], f"{warm} + {sc['profile_steps']}"))
    out.append(("fsdp", c.import_s + build + comp + (warm + sc["fsdp_steps"]) * fl * b["s_per_flop"],
                f"{warm} + {sc['fsdp_steps']}"))
    # the tutorial's small model, bounded by a step of the check's model (eager): its steps and its evaluations
    # (every 25 steps, 4 batches of 32 windows each, forward only)
    evals = sc["tutorial_steps"] // 25 + 1
    out.append(("tutorial_text", (sc["tutorial_steps"] + 4 * evals) * e["step_s"] + build, str(sc["tutorial_steps"])))
    return out


def print_plan(c: Check, ests: list[tuple[str, float, str]]) -> dict:
    budget = c.clock.left()
    planned, left_out = make_plan([(n, s) for n, s, _ in ests], budget)
    steps = {n: st for n, _, st in ests}
    print(f"\ngpu_check plan: deadline {c.clock.deadline:.0f} s, {c.clock.elapsed():.0f} s used, {c.clock.margin:.0f} s "
          f"margin, {budget:.0f} s to plan. The seconds are ESTIMATES: the calibration's seconds per FLOP on this "
          "device x each part's FLOPs, plus a build and a compile per model at the calibration's times")
    print(f"  {'part':<28}{'steps':>16}{'est. s':>10}{'cumulative':>12}")
    for n, s, cum in planned:
        print(f"  {n:<28}{steps[n]:>16}{s:>10.1f}{cum:>12.1f}")
    for n, s in left_out:
        print(f"  {n:<28}{steps[n]:>16}{s:>10.1f}{'does not fit':>12}")
    total = planned[-1][2] if planned else 0.0
    print(f"  planned: {total:.0f} s (estimated) of {budget:.0f} s; profile runs only if the MFU target is missed\n",
          flush=True)
    return dict(note="estimated seconds (not measurements): calibration seconds per FLOP x analytic FLOPs, plus a build "
                     "and a compile per model at the calibration's times",
                budget_s=round(budget, 1), elapsed_at_plan_s=round(c.clock.elapsed(), 1),
                parts=[dict(part=n, steps=steps[n], estimated_s=round(s, 1), cumulative_s=round(cum, 1)) for n, s, cum in planned],
                left_out=[dict(part=n, steps=steps[n], estimated_s=round(s, 1)) for n, s in left_out],
                planned_total_s=round(total, 1))


# ----------------------------------------------------------------------------- verdicts and the summary
def judge(c: Check) -> None:
    rec, smoke = c.rec, c.args.smoke
    peak_kind = "measured fp32 matmul (smoke: no data sheet on a CPU)" if smoke else "data sheet, bf16"
    tvp = rec.get("trainer_vs_plain")
    if tvp and tvp.get("status") == "done":
        key = "measured" if smoke else "datasheet"
        mfu = (tvp["mfu"].get("accellib+compile") or {}).get(key)
        rec.verdict(f"MFU of the trainer with train.compile=blocks ({peak_kind})", mfu, f">= {c.args.mfu_target:.0%}",
                    None if mfu is None else mfu >= c.args.mfu_target)
        for name, r in tvp["ratios"].items():
            if name in ("accellib / plain", "accellib+compile / plain+compile"):
                rec.verdict(f"tokens/s {name}", r, f">= {RATIO_TARGET}", r >= RATIO_TARGET)
    base = rec.data["arms"].get("baseline") or {}
    for arm, m in rec.data["arms"].items():
        if m.get("status") != "done":
            continue
        if "graphs" in m and "second_half" in m["graphs"]:
            g = m["graphs"]["second_half"]
            rec.verdict(f"{arm}: graphs compiled in the second half of the timed steps", g, "0", g == 0)
        if arm in DROPPING and base.get("status") == "done":
            r = realized(m, base)
            m["realized_speedup"] = r
            val = r["realized"] if r else None
            rec.verdict(f"{arm}: realized speed-up (time saving / FLOPs saving)", val, f">= {REALIZED_TARGET:.0%}",
                        None if val is None else val >= REALIZED_TARGET)
    tut = rec.get("tutorial_text")
    if tut and tut.get("status") == "done":
        rec.verdict("tutorial on real text: |val loss - CPU cache|", abs(tut["difference"]), f"<= {TUTORIAL_TOL}",
                    tut["within"])


def summary(c: Check) -> None:
    d = c.rec.data
    print(f"\ngpu_check summary ({c.gpu}, {d['elapsed_s']:.0f} s of the {c.clock.deadline:.0f} s deadline)")
    for name, p in d["parts"].items():
        print(f"  {name:<26}{p.get('status', ''):>8}{p.get('seconds', 0):>8.1f} s  (estimated {p.get('estimated_s', '-')})")
    if d["arms"]:
        print(f"  {'arm':<22}{'status':>8}{'tok/s':>12}{'MFU sheet':>11}{'MFU meas.':>11}{'peak GB':>9}{'graphs 2nd half':>16}{'s':>7}")
        for arm, m in d["arms"].items():
            mfu = m.get("mfu") or {}
            cell = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            print(f"  {arm:<22}{m.get('status', ''):>8}{cell(m.get('tok_per_s'), ',.0f'):>12}"
                  f"{cell(mfu.get('datasheet'), '.1%'):>11}{cell(mfu.get('measured'), '.1%'):>11}"
                  f"{cell(m.get('peak_mem_gb'), '.2f'):>9}{cell((m.get('graphs') or {}).get('second_half'), 'd'):>16}"
                  f"{m.get('seconds', 0):>7.1f}")
    for name, why in d["skipped"].items():
        print(f"  skipped {name}: {why}")
    if c.args.smoke and d["verdicts"]:
        print("  (smoke run: a toy model for a few steps on a CPU; the verdicts below only show that the check's "
              "machinery works, their numbers say nothing about a GPU)")
    for v in d["verdicts"]:
        word = "NOT MEASURED" if v["passed"] is None else ("PASS" if v["passed"] else "MISSED")
        meas = v["measured"]
        meas = f"{meas:.4g}" if isinstance(meas, float) else meas
        print(f"  {word:<13}{v['what']}: {meas} (target {v['target']})")
    print(f"wrote {c.rec.path}", flush=True)


# ----------------------------------------------------------------------------- main
def run_check(c: Check, chosen: list[str]) -> None:
    """The parts in order: the environment whatever the clock says, then the alarm is set, the calibration, the
    plan, and each further part when its estimate fits in what is left."""
    rec, clock, args = c.rec, c.clock, c.args
    env = run_part("environment", 0.0, lambda: part_environment(c), rec, clock, force=True) or {}
    clock.arm_alarm()
    cal = run_part("calibration", 0.0, lambda: part_calibration(c), rec, clock)
    arms = []
    for a in chosen:
        if a == "lowp_fp8" and args.smoke:
            rec.skip("arm:lowp_fp8", "needs a CUDA GPU with FP8 tensor cores (torchao.float8)")
        elif a == "lowp_fp8" and (env.get("torchao") or {}).get("reason") is not None:
            rec.skip("arm:lowp_fp8", env["torchao"]["reason"])
        elif not (env.get("compile_probe") or {}).get("ok", False):
            rec.skip(f"arm:{a}", "train.compile=blocks cannot run: the compile probe failed (environment.compile_probe)")
        else:
            arms.append(a)
    names = ["matmul_peak", "trainer_vs_plain", *(f"arm:{a}" for a in arms), "profile", "fsdp", "tutorial_text"]
    if cal is None:  # nothing to plan from
        for name in names:
            rec.skip(name, "the calibration did not run (see above)")
        return
    ests = estimates(c, arms)
    rec.data["plan"] = print_plan(c, ests)
    rec.save()
    est = {n: s for n, s, _ in ests}

    def missed_mfu() -> bool:
        tvp = rec.get("trainer_vs_plain") or {}
        mfu = ((tvp.get("mfu") or {}).get("accellib+compile") or {}).get("measured" if args.smoke else "datasheet")
        return mfu is not None and mfu < args.mfu_target

    # (name, its estimate at its turn, what it runs, whether it is wanted at its turn)
    queue = [("matmul_peak", lambda: est["matmul_peak"], lambda: part_matmul_peak(c), None),
             ("trainer_vs_plain", lambda: est["trainer_vs_plain"], lambda: part_trainer_vs_plain(c), None)]
    # each arm's estimate is corrected by how the previous arm's time compared with its estimate
    queue += [(f"arm:{a}", lambda a=a: est[f"arm:{a}"] * c.correction, lambda a=a: part_arm(c, a), None) for a in arms]
    queue += [("profile", lambda: est["profile"], lambda: part_profile(c), missed_mfu),
              ("fsdp", lambda: est["fsdp"], lambda: part_fsdp(c), None),
              ("tutorial_text", lambda: est["tutorial_text"], lambda: part_tutorial(c), None)]
    for name, e, fn, wanted in queue:
        if wanted is not None and not wanted():
            continue
        m = run_part(name, e(), fn, rec, clock)
        if name.startswith("arm:") and m and m.get("status") == "done" and est[name] > 0:
            c.correction = min(3.0, max(0.3, m["seconds"] / est[name]))


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3' (the JSON's name)."""
    s = name.lower().removeprefix("nvidia").strip()
    return "".join(ch if ch.isalnum() else "_" for ch in s).strip("_") or "cuda"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU stand-in: a tiny model, a few steps, every part")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_CHECK_DEADLINE", DEADLINE_S)),
                    help=f"seconds of wall for the whole check (default $GPU_CHECK_DEADLINE, else {DEADLINE_S:.0f})")
    ap.add_argument("--margin", type=float, default=None,
                    help="seconds kept free before the deadline (default 15; --smoke 2)")
    ap.add_argument("--out-dir", default=os.environ.get("GPU_CHECK_OUT"),
                    help="folder of the JSON (default $GPU_CHECK_OUT, else results/; --smoke: runs/gpu_check_smoke/)")
    ap.add_argument("--out", default=None, help="the JSON's path (overrides --out-dir)")
    ap.add_argument("--runs", default=None, help="scratch folder: token data, the V-cycle's run, wheels (default "
                                                 "runs/gpu_check, beside the JSON with --smoke)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per arm after its warm-up (default 60; --smoke 6)")
    ap.add_argument("--arms", default="", help=f"comma-separated subset of {', '.join(ARMS)} (default: all)")
    ap.add_argument("--peak-flops", type=float, default=0.0,
                    help="the data-sheet peak bf16 FLOP/s of the GPU for the MFU (passed as --train.peak_flops); "
                         "default: the table in accellib/core/hardware.py, which needs it for a GPU it does not list")
    ap.add_argument("--mfu-target", type=float, default=MFU_TARGET, help=argparse.SUPPRESS)  # tests: a target missed
    ap.add_argument("--compile-backend", default=None, choices=["inductor", "aot_eager", "eager"],
                    help="--smoke only: train.compile's backend (default eager; inductor needs a C compiler)")
    ap.add_argument("--fsdp-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    if args.fsdp_worker:
        return fsdp_worker(json.loads(args.fsdp_worker))
    if args.compile_backend and not args.smoke:
        ap.error("--compile-backend is for --smoke; the GPU check measures the shipped config's inductor")
    problem = preflight(args.smoke)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 1
    import torch
    sc = SCALE["smoke" if args.smoke else "gpu"]
    args.steps = args.steps or sc["steps"]
    args.margin = sc["margin"] if args.margin is None else args.margin
    chosen = [a for a in args.arms.split(",") if a] or list(ARMS)
    if unknown := [a for a in chosen if a not in ARMS]:
        ap.error(f"unknown arm(s) {unknown}; the arms: {', '.join(ARMS)}")
    if args.smoke:
        torch.set_num_threads(1)
    gpu = "cpu" if args.smoke else torch.cuda.get_device_name(0)
    out_dir = Path(args.out_dir or (ROOT / "runs" / "gpu_check_smoke" if args.smoke else ROOT / "results"))
    out = Path(args.out) if args.out else out_dir / (f"gpu_check_smoke_{gpu}.json" if args.smoke else f"gpu_check_{gpu_slug(gpu)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    args.runs = args.runs or str(out.with_name(out.stem + "_runs") if args.smoke else ROOT / "runs" / "gpu_check")
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    clock = Clock(args.deadline, args.margin)
    from accellib.core.records import command_line, git_commit
    rec = Record(out, dict(check="benchmarks/gpu_check.py (issue 34)", device=gpu, smoke=args.smoke,
                           deadline_s=args.deadline, margin_s=args.margin,
                           started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), git_commit=git_commit(),
                           command=command_line("benchmarks/gpu_check.py", sys.argv[1:] if argv is None else argv, ROOT),
                           config=CONFIG, arms_asked=chosen,
                           data="uniform random GPT-2 ids (no text): losses only show that training ran"))
    print(f"gpu_check: {gpu}, torch {torch.__version__}; deadline {args.deadline:.0f} s; writing {out} after every part",
          flush=True)
    c = Check(args, rec, clock)
    c.import_s = clock.elapsed()
    run_check(c, chosen)
    clock.disarm()
    judge(c)
    rec.data["finished"] = True
    rec.save()
    summary(c)
    if clock.expired:  # a part was cut mid-way: compile workers may still hold the interpreter; the record is written
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
