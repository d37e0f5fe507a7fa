"""The notebooks' "your turn" checks: run a student's function and accellib's on the same inputs, say pass or fail.

Every notebook 01-08 has one "your turn" cell, where the student writes the core of the method, and one check cell
right after it that calls `check`. The pattern is the same everywhere:

- the student's function is shipped empty (its body is `raise NotImplementedError`), so the notebook runs as
  shipped and the check says the function is not written yet; everything after it uses accellib's function;
- once written, the check runs both functions on random inputs and prints PASS, or FAIL with the first input
  whose outputs differ (or the exception the student's function raised);
- each function gets its own clones of the inputs; an answer that writes into an input (which the reference
  does not) fails, naming the input and its first changed element; with `grad=True` floating inputs require
  gradients and an answer must carry them back (its input gradients are compared with the reference's), so an
  answer that breaks autograd (a .detach(), .item(), numpy round trip or an in-place write on a leaf) fails;
  an answer that does not return within `timeout` seconds (an endless loop) is stopped with a one-line FAIL;
- the reference answers are in `notebooks/solutions/`, and `tests/test_exercises.py` runs each check cell on its
  solution (it must PASS) and on the shipped cell (it must say "not written yet").
"""
from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager, nullcontext
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


def _show_case(args: tuple, kwargs: dict, names: list[str]) -> str:
    """Every argument by name, each short: 'x=tensor(2, 16, 8) float32 [...], keep=tensor(2, 4) int64: [3, 0, ...], r=4'."""
    def one(v):
        if isinstance(v, torch.Tensor):
            vals = v.flatten()[:6].tolist()
            return f"tensor{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}: {vals}" + (" ..." if v.numel() > 6 else "")
        return _show(v, 60)
    named = [(names[k] if k < len(names) else f"arg{k + 1}", a) for k, a in enumerate(args)] + list(kwargs.items())
    return ", ".join(f"{n}={one(v)}" for n, v in named)


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


class _Hang(Exception):
    pass


@contextmanager
def _time_limit(seconds: float):
    """Raise _Hang in the calling code after `seconds` (SIGALRM: the main thread of a Unix process, as a notebook
    kernel runs cells); elsewhere no limit."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    def ring(*_):
        raise _Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _clone(x: Any, grad: bool) -> Any:
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(True) if grad and c.is_floating_point() else c
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v, grad) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v, grad) for k, v in x.items()}
    return x


def _tensors(x: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in an input: 'x', 'x[1]', 'x["w"]'."""
    if isinstance(x, torch.Tensor):
        return [(path, x)]
    if isinstance(x, (list, tuple)):
        return [t for k, v in enumerate(x) for t in _tensors(v, f"{path}[{k}]")]
    if isinstance(x, dict):
        return [t for k, v in x.items() for t in _tensors(v, f"{path}[{k!r}]")]
    return []


def _inputs(args: tuple, kwargs: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor among a call's inputs, by the student's parameter names ('x', 'batches[1]')."""
    named = [(names[k] if k < len(names) else f"argument {k + 1}", a) for k, a in enumerate(args)] + list(kwargs.items())
    return {n: t for name, a in named for n, t in _tensors(a, name)}


def _grads(out: Any, inputs: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor | None]:
    """d(sum of every floating output tensor)/d(each input that requires grad); None where no path exists."""
    outs = [t for _, t in _tensors(out) if t.is_floating_point()]
    leaves = [(n, t) for n, t in inputs if t.requires_grad]
    if not outs or not leaves:
        return {}
    total = sum(o.sum() for o in outs)
    if not getattr(total, "requires_grad", False):
        return {n: None for n, _ in leaves}
    g = torch.autograd.grad(total, [t for _, t in leaves], allow_unused=True)
    return {n: v for (n, _), v in zip(leaves, g)}


def check(student: Callable, reference: Callable, cases: Iterable[tuple | dict], *, atol: float = 0.0,
          rtol: float = 0.0, grad: bool = False, timeout: float = 10.0) -> bool:
    """Call `student(*case)` and `reference(*case)` on every case (a tuple of positional arguments, or a dict of
    keyword arguments), each on its own clones of the inputs, and print one verdict: PASS on every case, FAIL with
    the first case that differs (its output, an input it changed in place, its input gradients when `grad`, an
    exception, or no answer within `timeout` seconds), or that the student's function is not written yet.
    Outputs compare exactly unless `atol` / `rtol` are given (floats and floating tensors). Returns True only on
    PASS; a check cell assigns it (`ok = check(...)`) so the cell shows only the printed line."""
    import inspect
    name, ref = getattr(student, "__name__", "your function"), getattr(reference, "__name__", "accellib's")
    try:
        arg_names = list(inspect.signature(student).parameters)
    except (TypeError, ValueError):
        arg_names = []
    cases = list(cases)
    for k, case in enumerate(cases):
        args, kwargs = ((), case) if isinstance(case, dict) else (tuple(case), {})
        r_args, r_kwargs = _clone(args, grad), _clone(kwargs, grad)
        with torch.enable_grad() if grad else nullcontext():
            expected = reference(*r_args, **r_kwargs)
        s_args, s_kwargs = _clone(args, grad), _clone(kwargs, grad)
        head = f"FAIL on case {k + 1} of {len(cases)}:"
        try:
            with _time_limit(timeout), torch.enable_grad() if grad else nullcontext():
                got = student(*s_args, **s_kwargs)
        except NotImplementedError:
            print(f"{name} {NOT_WRITTEN}: the rest of the notebook uses accellib's {ref}. "
                  f"Write it in the cell above, then run this cell again.")
            return False
        except _Hang:
            print(f"{head} {name} did not return within {timeout:g} s (an endless loop?); it was stopped.")
            return False
        except Exception as e:   # the student's bug, shown as the verdict rather than a traceback
            print(f"{head} {name}({_show_case(args, kwargs, arg_names)}) raised {type(e).__name__}: {e}")
            return False
        inputs = _inputs(args, kwargs, arg_names)
        mine, theirs = _inputs(s_args, s_kwargs, arg_names), _inputs(r_args, r_kwargs, arg_names)
        for n, t in inputs.items():
            if not _same(mine[n].detach(), t, 0.0, 0.0) and _same(theirs[n].detach(), t, 0.0, 0.0):
                print(f"{head} {name} changed its input `{n}` in place; compute a new tensor instead"
                      + _where(mine[n].detach(), t, 0.0, 0.0))
                return False
        if not _same(_detach(got), _detach(expected), atol, rtol):
            print(f"{head} inputs {_show_case(args, kwargs, arg_names)}\n"
                  f"  expected ({ref}): {_show(expected)}\n  got ({name}): {_show(got)}"
                  + _where(_detach(got), _detach(expected), atol, rtol))
            return False
        if grad:
            g_ref = _grads(expected, list(theirs.items()))
            g_got = _grads(got, list(mine.items()))
            for n, ge in g_ref.items():
                gg = g_got.get(n)
                if ge is not None and gg is None:
                    print(f"{head} {name}'s output carries no gradient back to `{n}` (autograd was broken: "
                          ".detach(), .item(), a numpy round trip or an in-place write?)")
                    return False
                if ge is not None and not _same(gg, ge, max(atol, 1e-6), max(rtol, 1e-5)):
                    print(f"{head} {name}'s gradient with respect to `{n}` differs from {ref}'s"
                          + _where(gg, ge, max(atol, 1e-6), max(rtol, 1e-5)))
                    return False
    print(f"PASS: {name} matches accellib's {ref} on all {len(cases)} random cases.")
    return True


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach(v) for v in x)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x
