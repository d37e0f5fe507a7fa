"""The notebooks' "your turn" checks: run a student's function and accellib's on the same inputs, say pass or fail.

Every notebook 01-08 has one "your turn" cell, where the student writes the core of the method, and one check cell
right after it that calls `check`. The pattern is the same everywhere:

- the student's function is shipped empty (its body is `raise NotImplementedError`), so the notebook runs as
  shipped and the check says the function is not written yet; everything after it uses accellib's function;
- once written, the check runs both functions on random inputs and prints PASS, or FAIL with the first input
  whose outputs differ (or the exception the student's function raised), with a pointer to the first element
  that differs (a tensor's index, a list's index, a dict's key);
- each function gets its own copies of the inputs (tensors, lists, tuples, dicts, numpy arrays, nested); an
  answer that writes into an input (which the reference does not) fails in one line, naming the input and its
  first changed element; with `grad=True` floating inputs require gradients and an answer must carry them back
  (its input gradients are compared with the reference's), so an answer that breaks autograd (a .detach(),
  .item(), numpy round trip or an in-place write on a leaf) fails; an answer that does not return within
  `timeout` seconds (an endless loop) is stopped with a one-line FAIL;
- where accellib's function returns a list or a tuple, an answer may return either; a numpy array or a tensor
  there is refused in one line that says how to return a list; a comparison never ends in a traceback;
- inputs are shown short: a tensor by its shape, dtype and first values, a module by its class and parameter count;
- a function that passed its check is remembered (this very function object): `use(mine, accellib_s)` in a
  routing cell (the cell that puts the student's function into a live run) gives the student's function only if
  it passed, whatever a later cell bound to `ok`, and `routed(fn)` guards that run with a timeout and one verdict
  line instead of a traceback;
- the reference answers are in `notebooks/solutions/`, and `tests/test_exercises.py` runs each check cell on its
  solution (it must PASS) and on the shipped cell (it must say "not written yet").
"""
from __future__ import annotations

import math
import signal
import threading
import weakref
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterable

import torch

NOT_WRITTEN = "is not written yet"
_PASSED: "weakref.WeakKeyDictionary[Callable, object]" = weakref.WeakKeyDictionary()   # function -> its code


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "dtype")


def _same(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Equal within the tolerances (floats and floating tensors); lists and tuples compare as sequences. Never raises."""
    try:
        return _same_raw(a, b, atol, rtol)
    except Exception:
        return False


def _same_raw(a: Any, b: Any, atol: float, rtol: float) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or b.dtype.is_floating_point:
            return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))
        return bool(torch.equal(a, b))
    if _is_numpy(a) or _is_numpy(b):
        if not (_is_numpy(a) and _is_numpy(b)):
            return False
        return _same_raw(torch.as_tensor(a), torch.as_tensor(b), atol, rtol)
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        return math.isclose(float(a), float(b), abs_tol=atol, rel_tol=rtol) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_raw(a[k], b[k], atol, rtol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_raw(x, y, atol, rtol) for x, y in zip(a, b))
    return bool(a == b)


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "a tensor"
    if _is_numpy(x):
        return "a numpy array" if getattr(x, "ndim", 0) else "a numpy scalar"
    return {list: "a list", tuple: "a tuple", dict: "a dict", float: "a float", int: "an int", bool: "a bool",
            str: "a string", type(None): "None"}.get(type(x), f"a {type(x).__name__}")


def _refuse(got: Any, expected: Any, ref: str) -> str:
    """Why an output of the wrong kind cannot be compared ('' when the kinds fit), with how to fix it."""
    if isinstance(expected, (list, tuple)) and (_is_numpy(got) or isinstance(got, torch.Tensor)):
        return f"returned {_kind(got)} where accellib's {ref} returns {_kind(expected)}: return a list (e.g. `.tolist()`)"
    if isinstance(expected, float) and (isinstance(got, torch.Tensor) or _is_numpy(got)):
        return f"returned {_kind(got)} where accellib's {ref} returns a Python float: return `.item()` of it"
    if isinstance(expected, torch.Tensor) and isinstance(got, (list, tuple, float, int)) and not isinstance(got, bool):
        return f"returned {_kind(got)} where accellib's {ref} returns a tensor: keep the result a tensor"
    return ""


def _show(x: Any, width: int = 160) -> str:
    """A short preview: a tensor by shape, dtype and first values, a module by class and parameter count, else its repr
    on one line."""
    if isinstance(x, torch.Tensor):
        text = f"tensor{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}: {x.detach().flatten()[:12].tolist()}" \
               + (" ..." if x.numel() > 12 else "")
    elif isinstance(x, torch.nn.Module):
        text = f"{type(x).__name__}({sum(p.numel() for p in x.parameters()):,} parameters)"
    elif _is_numpy(x) and getattr(x, "ndim", 0):
        text = f"numpy array{tuple(x.shape)} {x.dtype}: {x.flatten()[:12].tolist()}" + (" ..." if x.size > 12 else "")
    elif callable(x) and hasattr(x, "__name__"):
        text = f"<function {x.__name__}>"
    else:
        text = " ".join(repr(x).split())
    return text if len(text) <= width else text[: width - 4] + " ..."


def _show_case(args: tuple, kwargs: dict, names: list[str]) -> str:
    """Every argument by name, each short: 'x=tensor(2, 16, 8) float32: [...], keep=tensor(2, 4) int64: [3, 0, ...], r=4'."""
    def one(v):
        if isinstance(v, torch.Tensor):
            vals = v.detach().flatten()[:6].tolist()
            return f"tensor{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}: {vals}" + (" ..." if v.numel() > 6 else "")
        return _show(v, 60)
    named = [(names[k] if k < len(names) else f"arg{k + 1}", a) for k, a in enumerate(args)] + list(kwargs.items())
    return ", ".join(f"{n}={one(v)}" for n, v in named)


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else _show(v, 40)


def _first_diff(got: Any, expected: Any, atol: float, rtol: float, path: str = "") -> tuple[str, Any, Any, str] | None:
    """(where, got there, expected there, how many differ) of the first element that differs, or None."""
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor):
        if got.shape != expected.shape:
            return (f"the shape of {path}" if path else "the shape", tuple(got.shape), tuple(expected.shape), "")
        g, e = got.detach().double(), expected.detach().double()
        bad = ~torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)
        if not bad.any():
            return None
        i = tuple(int(v) for v in bad.nonzero()[0])
        at = f"{path}[{', '.join(map(str, i))}]" if path else f"index {i}"
        return (at, g[i].item(), e[i].item(), f"{int(bad.sum())} of {bad.numel()} differ")
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        for k, (a, b) in enumerate(zip(got, expected)):
            if not _same(a, b, atol, rtol):
                return _first_diff(a, b, atol, rtol, f"{path}[{k}]") or (f"{path}[{k}]" if path else f"index {k}", a, b, "")
        if len(got) != len(expected):
            return (f"length of {path}" if path else "the length", len(got), len(expected), "")
        return None
    if isinstance(got, dict) and isinstance(expected, dict):
        if got.keys() != expected.keys():
            return (f"the keys of {path}" if path else "the keys", sorted(map(str, got)), sorted(map(str, expected)), "")
        for k in expected:
            if not _same(got[k], expected[k], atol, rtol):
                return _first_diff(got[k], expected[k], atol, rtol, f"{path}[{k!r}]") or (f"{path}[{k!r}]", got[k], expected[k], "")
        return None
    return None


def _where(got: Any, expected: Any, atol: float, rtol: float) -> str:
    """'first difference at index 3: got 0.5, expected 0.25' for tensors, lists and dicts ('' where nothing points)."""
    try:
        d = _first_diff(got, expected, atol, rtol)
    except Exception:
        return ""
    if d is None:
        return ""
    at, g, e, n = d
    return f"first difference at {at}: got {_num(g)}, expected {_num(e)}" + (f" ({n})" if n else "")


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
    if _is_numpy(x):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v, grad) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v, grad) for k, v in x.items()}
    return x


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach(v) for v in x)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
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


def _named(args: tuple, kwargs: dict, names: list[str]) -> dict[str, Any]:
    """Every argument of a call by the student's parameter name ('x', 'sens'), positional ones first."""
    out = {(names[k] if k < len(names) else f"argument {k + 1}"): a for k, a in enumerate(args)}
    out.update(kwargs)
    return out


def _inputs(args: tuple, kwargs: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor among a call's inputs, by the student's parameter names ('x', 'batches[1]')."""
    return {n: t for name, a in _named(args, kwargs, names).items() for n, t in _tensors(a, name)}


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


def _changed(name: str, mine: Any, theirs: Any, orig: Any) -> str:
    """One line when the student's copy of an input changed and the reference's did not ('' otherwise)."""
    mine, theirs = _detach(mine), _detach(theirs)
    if _same(mine, orig, 0.0, 0.0) or not _same(theirs, orig, 0.0, 0.0):
        return ""
    what = "tensor" if isinstance(orig, torch.Tensor) else _kind(orig).split()[-1]
    d = None
    try:
        d = _first_diff(mine, orig, 0.0, 0.0, name)
    except Exception:
        pass
    where = f" ({d[0]} is now {_num(d[1])}, was {_num(d[2])}" + (f"; {d[3]}" if d[3] else "") + ")" if d else ""
    return f"changed its input `{name}` in place{where}; compute a new {what} instead"


def check(student: Callable, reference: Callable, cases: Iterable[tuple | dict], *, atol: float = 0.0,
          rtol: float = 0.0, grad: bool = False, timeout: float = 10.0) -> bool:
    """Call `student(*case)` and `reference(*case)` on every case (a tuple of positional arguments, or a dict of
    keyword arguments), each on its own copies of the inputs, and print one verdict: PASS on every case, FAIL with
    the first case that differs (its output, an input it changed in place, its input gradients when `grad`, an
    exception, or no answer within `timeout` seconds), or that the student's function is not written yet.
    Outputs compare exactly unless `atol` / `rtol` are given (floats and floating tensors). Returns True only on
    PASS, and remembers the function that passed (`use`); a check cell assigns it (`ok = check(...)`) so the cell
    shows only the printed line."""
    import inspect
    _PASSED.pop(student, None)
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
            msg = " ".join(str(e).split())
            print(f"{head} {name}({_show_case(args, kwargs, arg_names)}) raised {type(e).__name__}: {msg[:300]}")
            return False
        try:
            verdict = _judge(name, ref, args, kwargs, (s_args, s_kwargs), (r_args, r_kwargs), got, expected,
                             arg_names, atol, rtol, grad)
        except Exception as e:   # a comparison that cannot be made is a verdict too, never a traceback
            verdict = f"{name}'s output could not be compared with {ref}'s ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        if verdict:
            print(f"{head} {verdict}")
            return False
    _PASSED[student] = getattr(student, "__code__", None)
    print(f"PASS: {name} matches accellib's {ref} on all {len(cases)} random cases.")
    return True


def _judge(name, ref, args, kwargs, student_in, reference_in, got, expected, arg_names, atol, rtol, grad) -> str:
    """What is wrong with one case ('' when nothing is): an input changed in place, an output of the wrong kind, a
    value that differs, a gradient missing or different."""
    originals = _named(args, kwargs, arg_names)
    mine, theirs = _named(*student_in, arg_names), _named(*reference_in, arg_names)
    for n, orig in originals.items():
        why = _changed(n, mine[n], theirs[n], orig)
        if why:
            return f"{name} {why}"
    refused = _refuse(got, expected, ref)
    if refused:
        return f"{name} {refused}"
    g, e = _detach(got), _detach(expected)
    if not _same(g, e, atol, rtol):
        where = _where(g, e, atol, rtol)
        return (f"inputs {_show_case(args, kwargs, arg_names)}\n  expected ({ref}): {_show(expected)}\n"
                f"  got ({name}): {_show(got)}" + (f"\n  {where}" if where else ""))
    if grad:
        ins_mine, ins_ref = _inputs(*student_in, arg_names), _inputs(*reference_in, arg_names)
        g_ref, g_got = _grads(expected, list(ins_ref.items())), _grads(got, list(ins_mine.items()))
        for n, ge in g_ref.items():
            gg = g_got.get(n)
            if ge is not None and gg is None:
                return (f"{name}'s output carries no gradient back to `{n}` (autograd was broken: "
                        ".detach(), .item(), a numpy round trip or an in-place write?)")
            tol = (max(atol, 1e-6), max(rtol, 1e-5))
            if ge is not None and not _same(gg, ge, *tol):
                where = _where(gg, ge, *tol)
                return f"{name}'s gradient with respect to `{n}` differs from {ref}'s" + (f": {where}" if where else "")
    return ""


def passed(fn: Callable) -> bool:
    """True if this very function object passed its check (a redefinition after the check has not)."""
    return fn in _PASSED and _PASSED[fn] is getattr(fn, "__code__", None)


def use(student: Callable, reference: Callable) -> Callable:
    """The function a routing cell runs: the student's if it passed its check, else accellib's. It reads what the
    check remembered, not a global the notebook may have rebound since."""
    return student if passed(student) else reference


@contextmanager
def routed(fn: Callable, what: str = "the run", timeout: float = 600.0):
    """Guard the live run of a routing cell. With a student's function (one that passed its check) an exception
    inside the block, the run's own assertion included, or no end within `timeout` seconds prints one FAIL line
    instead of a traceback; with accellib's function nothing is caught (an error there is the notebook's)."""
    if not passed(fn):
        yield
        return
    name = getattr(fn, "__name__", "your function")
    try:
        with _time_limit(timeout):
            yield
    except _Hang:
        print(f"FAIL: {what} with {name} did not end within {timeout:g} s; it was stopped.")
    except AssertionError as e:
        print(f"FAIL: {' '.join(str(e).split()) or f'{what} with {name} did not give the expected result'}")
    except Exception as e:
        print(f"FAIL: {name} raised {type(e).__name__} during {what}: {' '.join(str(e).split())[:300]}")
