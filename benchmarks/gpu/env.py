"""Before anything starts: the one-line refusals (no torch, no GPU, no C compiler, no Python.h), then the
environment part (versions, whether a torch.compile'd function compiles and runs) and torchao from .whl/."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

from .base import ROOT, rel


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


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3' (the JSON's name)."""
    s = name.lower().removeprefix("nvidia").strip()
    return "".join(ch if ch.isalnum() else "_" for ch in s).strip("_") or "cuda"


def setup_torchao(whl_dir: Path, target_root: Path) -> dict:
    """torchao for the FP8 point: the installed one, else the wheels in `whl_dir` installed into a temporary
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
        how = "pip --target" if p is not None and p.returncode == 0 else "unzipped"
        info["source"] = f"{rel(whl_dir)}/{wheels[-1].name} ({how})"
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


def features() -> dict:
    """Which of issue 42's library features this checkout has (other items of the issue add them): the check
    uses each when present and says here when it falls back."""
    import inspect

    from accellib.core import trainer
    from accellib.core.config import TrainConfig
    from accellib.techniques import random_ltd, sensitivity_layer_drop
    fields = TrainConfig.__dataclass_fields__
    return dict(compile_model="model" in (fields["compile"].metadata.get("choices") or []),
                one_off=hasattr(trainer.Trainer, "one_off"),
                sbld_profile_one_off="one_off" in inspect.getsource(sensitivity_layer_drop),
                random_ltd_attention="attention" in random_ltd.RandomLTDConfig.__dataclass_fields__,
                fp8_table=(ROOT / "benchmarks" / "fp8_table.py").is_file())


def part_environment(c) -> dict:
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
    backend = c.backend
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
    out["features"] = features()
    c.features = out["features"]
    return out
