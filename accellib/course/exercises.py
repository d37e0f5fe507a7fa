"""The notebooks' "your turn" checks: run a student's function and accellib's on the same inputs, say pass or fail.

Every notebook 01-08 has one "your turn" cell, where the student writes the core of the method, and one check cell
right after it that calls `check`. The pattern is the same everywhere:

- the student's function is shipped empty (its body is `raise NotImplementedError`), so the notebook runs as
  shipped and the check says the function is not written yet; everything after it uses accellib's function;
- once written, the check runs both functions on random inputs and prints PASS, or FAIL with the first input
  whose outputs differ (or the exception the student's function raised);
- the reference answers are in `notebooks/solutions/`, and `tests/test_exercises.py` runs each check cell on its
  solution (it must PASS) and on the shipped cell (it must say "not written yet").
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

NOT_WRITTEN = "is not written yet"


def _same(a: Any, b: Any, atol: float, rtol: float) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or b.dtype.is_floating_point:
            return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), abs_tol=atol, rel_tol=rtol) or (math.isnan(a) and math.isnan(b))
        except (TypeError, ValueError):
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], atol, rtol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, atol, rtol) for x, y in zip(a, b))
    return a == b


def _show(x: Any, width: int = 160) -> str:
    if isinstance(x, torch.Tensor):
        text = f"tensor{tuple(x.shape)} {x.dtype}: {x.flatten()[:12].tolist()}" + (" ..." if x.numel() > 12 else "")
    else:
        text = repr(x)
    return text if len(text) <= width else text[: width - 4] + " ..."


def _where(got: Any, expected: Any, atol: float, rtol: float) -> str:
    """For two tensors of one shape: the first element that differs (the preview may show only equal ones)."""
    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)) or got.shape != expected.shape:
        return ""
    g, e = got.double(), expected.double()
    bad = ~torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)
    if not bad.any():
        return ""
    i = tuple(int(v) for v in bad.nonzero()[0])
    return f"\n  first difference at index {i}: expected {e[i].item():.6g}, got {g[i].item():.6g} ({int(bad.sum())} differ)"


def check(student: Callable, reference: Callable, cases: Iterable[tuple | dict], *, atol: float = 0.0,
          rtol: float = 0.0) -> bool:
    """Call `student(*case)` and `reference(*case)` on every case (a tuple of positional arguments, or a dict of
    keyword arguments) and print one verdict: PASS on every case, FAIL with the first case that differs, or that
    the student's function is not written yet. Outputs compare exactly unless `atol` / `rtol` are given (floats
    and floating tensors). Returns True only on PASS."""
    name, ref = getattr(student, "__name__", "your function"), getattr(reference, "__name__", "accellib's")
    cases = list(cases)
    for k, case in enumerate(cases):
        args, kwargs = ((), case) if isinstance(case, dict) else (tuple(case), {})
        expected = reference(*args, **kwargs)
        try:
            got = student(*args, **kwargs)
        except NotImplementedError:
            print(f"{name} {NOT_WRITTEN}: the rest of the notebook uses accellib's {ref}. "
                  f"Write it in the cell above, then run this cell again.")
            return False
        except Exception as e:   # the student's bug, shown as the verdict rather than a traceback
            print(f"FAIL on case {k + 1} of {len(cases)}: {name}{_show(case)} raised {type(e).__name__}: {e}")
            return False
        if not _same(got, expected, atol, rtol):
            print(f"FAIL on case {k + 1} of {len(cases)}: inputs {_show(case)}\n"
                  f"  expected ({ref}): {_show(expected)}\n  got ({name}): {_show(got)}" + _where(got, expected, atol, rtol))
            return False
    print(f"PASS: {name} matches accellib's {ref} on all {len(cases)} random cases.")
    return True
