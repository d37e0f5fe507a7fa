"""accellib: readable implementations of techniques that make transformer training faster, on one Accelerate loop.

The layout is the architecture (docs/data_and_layout.md lists every module):
    train.py compare.py evaluate.py export.py   the command lines, `python -m accellib.X`
    core/        the one training loop and what it runs on     models/    the networks and losses
    data/        token and image folders on disk               techniques/  hook-point techniques
    parallel/    engines that split a step across processes    numerics/  emulated low precision
    drivers/     what builds several Trainers (V-cycle, comparison plan)
    analysis/    FLOPs, statistics, planner, trend, results, plotting      course/    the notebooks' checker
"""
import os
import sys
from pathlib import Path

__version__ = "0.1.0"
MIN_TORCH = "2.11"  # the oldest torch accellib runs under: the GPU image's (make gpu-image-check); the tests pin 2.13


def _check_torch() -> None:
    """A torch older than MIN_TORCH is refused at import in one line (read from the package metadata: importing
    torch here would slow every `import accellib`); no torch at all is left to the first `import torch`."""
    from importlib import metadata
    try:
        found = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return
    release = lambda v: tuple(int(x) for x in v.split("+")[0].split(".")[:2] if x.isdigit())  # noqa: E731
    if release(found) < release(MIN_TORCH):
        raise ImportError(f"accellib needs torch >= {MIN_TORCH}, and torch {found} is installed: "
                          f"pip install 'torch>={MIN_TORCH}'")


_check_torch()

# The repository checkout this package lives in (an editable install), where configs/, data/, results/
# and notebooks/ are; None for a package installed outside a checkout (`pip install .`).
_HERE = Path(__file__).resolve().parents[1]
CHECKOUT = _HERE if (_HERE / "pyproject.toml").is_file() and (_HERE / "configs").is_dir() else None


class CheckoutError(FileNotFoundError):
    """What needs the repository's configs/, data/ or results/ was asked of an installed package; one line."""


def repo_root(what: str = "this") -> Path:
    """The checkout's root, or a one-line CheckoutError saying that `what` needs one."""
    if CHECKOUT is None:
        raise CheckoutError(f"{what} needs a checkout of the accellib repository (its configs/, data/, results/), "
                            f"but accellib is installed in {_HERE}; clone the repository and `pip install -e .` there")
    return CHECKOUT


def __getattr__(name: str):
    if name == "REPO_ROOT":  # notebooks and tests: `from accellib import REPO_ROOT` (the checkout)
        return repo_root("accellib.REPO_ROOT")
    raise AttributeError(f"module 'accellib' has no attribute {name!r}")


def install_hint(extra: str) -> str:
    """How to install the optional extra `extra` (hf, track, notebooks, ...), as fits how accellib was installed: in a
    checkout, the editable install of that extra; from a wheel, the extra's own packages (pip cannot add an extra
    to a wheel it no longer has)."""
    if CHECKOUT is not None:
        return f"pip install -e '.[{extra}]' (in {CHECKOUT})"
    try:
        from importlib import metadata
        reqs = [r.split(";")[0].strip() for r in metadata.requires("accellib") or []
                if f'extra == "{extra}"' in r.replace("'", '"')]
    except Exception:  # no metadata (sources on sys.path by hand)
        reqs = []
    return "pip install " + " ".join(f"'{r}'" for r in reqs) if reqs else f"pip install 'accellib[{extra}]'"


def prog(command: str) -> str:
    """The name a command line calls itself by in --help: the console script it was started as (accellib-train),
    or `python -m accellib.train`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name == f"accellib-{command}" else f"python -m accellib.{command}"
