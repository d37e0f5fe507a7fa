"""The notebooks' "your turn" exercises (accellib/course/exercises.py): each of notebooks 01-08 has one "# YOUR TURN" cell
and a "# CHECK" cell right after it. As shipped the check says the function is not written yet; with the reference
answer from notebooks/solutions/ in place of the your-turn cell it must print PASS; and `check` itself reports the
first mismatch of a wrong answer."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch

from accellib.course.exercises import NOT_WRITTEN, check

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("0[1-8]_*.ipynb"))


def exercise(nb_path: Path) -> tuple[str, str, str]:
    """(your-turn cell, check cell, solution code) of a notebook; the solution is the first ```python block after
    the line '## Your turn' in its solutions file."""
    cells = [c for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code"]
    srcs = ["".join(c["source"]) for c in cells]
    turn = [i for i, s in enumerate(srcs) if s.lstrip().startswith("# YOUR TURN")]
    assert len(turn) == 1, f"{nb_path.name}: {len(turn)} '# YOUR TURN' cells, want one"
    i = turn[0]
    assert srcs[i + 1].lstrip().startswith("# CHECK"), f"{nb_path.name}: the cell after '# YOUR TURN' is not '# CHECK'"
    sol_md = (ROOT / "notebooks" / "solutions" / f"{nb_path.stem}_solutions.md").read_text()
    m = re.search(r"^## Your turn.*?```python\n(.*?)```", sol_md, re.S | re.M)
    assert m, f"{nb_path.stem}_solutions.md has no '## Your turn' section with a ```python block"
    return srcs[i], srcs[i + 1], m.group(1)


def solved(name: str) -> dict:
    """The namespace of notebook `name`'s check cell run after its solution (the check must pass): the check's
    reference function and the solved `my_...` function, as the notebook holds them once the exercise is done."""
    _, chk, solution = exercise(ROOT / "notebooks" / name)
    ns = {"__name__": "__exercise__"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(solution + "\n" + chk, "<cell>", "exec"), ns)
    assert ns["ok"]
    return ns


def run(*sources: str) -> str:
    out, ns = io.StringIO(), {"__name__": "__exercise__"}
    with contextlib.redirect_stdout(out):
        for s in sources:
            exec(compile(s, "<cell>", "exec"), ns)
    return out.getvalue()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_the_shipped_cell_is_empty_and_the_solution_passes(nb):
    torch.manual_seed(0)
    turn, chk, solution = exercise(nb)
    assert "raise NotImplementedError" in turn, f"{nb.name}: the your-turn cell must ship empty"
    shipped = run(turn, chk)
    assert NOT_WRITTEN in shipped and "PASS" not in shipped, shipped
    solved = run(solution, chk)
    assert "PASS:" in solved and "FAIL" not in solved, f"{nb.name}: the solution does not pass its check:\n{solved}"


def test_check_reports_the_first_mismatch_and_exceptions():
    ref = lambda x: [v * 2 for v in x]
    def wrong(x):
        return [v * 2 if v < 3 else v for v in x]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check(ref, ref, [([1, 2],), ([1, 5],)]) is True
        assert check(wrong, ref, [([1, 2],), ([1, 5],), ([7],)]) is False
    text = out.getvalue()
    assert "PASS: <lambda> matches" in text and "FAIL on case 2 of 3" in text and "[2, 10]" in text and "[2, 5]" in text
    def broken(x):
        return x[10]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check(broken, ref, [([1],)]) is False
    assert "raised IndexError" in out.getvalue()


def test_tensors_compare_exactly_unless_a_tolerance_is_given():
    a = torch.ones(3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert not check(lambda: a + 1e-6, lambda: a, [()])
        assert check(lambda: a + 1e-6, lambda: a, [()], atol=1e-5)
        assert not check(lambda: a[:2], lambda: a, [()])        # a shape mismatch is a mismatch
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        b = torch.zeros(20)
        assert not check(lambda: torch.cat([b[:15], torch.ones(5)]), lambda: b, [()])
    assert "first difference at index (15,): expected 0, got 1 (5 differ)" in out.getvalue()


def _out(fn, *a, **k):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = fn(*a, **k)
    return ok, buf.getvalue()


def test_check_fails_an_answer_that_writes_into_its_input():
    # each function gets clones: the in-place answer cannot corrupt the reference's inputs, and it is named
    ref = lambda x, r: x * r
    def in_place(x, r):
        x.mul_(r)
        return x
    ok, text = _out(check, in_place, ref, [(torch.arange(6.0), 2.0)])
    assert ok is False and "changed its input `x` in place" in text and "first difference at index (1,)" in text
    ok, text = _out(check, lambda x, r: x * r, ref, [(torch.arange(6.0), 2.0)])
    assert ok is True and text.count("\n") == 1          # PASS is one line


def test_check_with_grad_fails_an_answer_that_breaks_autograd():
    ref = lambda x: torch.tanh(x) * 2
    detached = lambda x: torch.tanh(x.detach()) * 2                       # the same values, no gradient path
    via_numpy = lambda x: torch.from_numpy(torch.tanh(x).detach().numpy() * 2)
    wrong_grad = lambda x: (torch.tanh(x) * 2).detach() + 0 * x          # values right, gradient zero
    x = torch.randn(5)
    for fn in (detached, via_numpy):
        ok, text = _out(check, fn, ref, [(x,)], grad=True, atol=1e-6)
        assert ok is False and "carries no gradient back to `x`" in text, text
    ok, text = _out(check, wrong_grad, ref, [(x,)], grad=True, atol=1e-6)
    assert ok is False and "gradient with respect to `x` differs" in text
    assert _out(check, lambda x: 2 * torch.tanh(x), ref, [(x,)], grad=True, atol=1e-6)[0] is True
    assert _out(check, detached, ref, [(x,)], atol=1e-6)[0] is True        # without grad=True values decide


def test_check_stops_an_answer_that_hangs():
    def hangs(x):
        while True:
            pass
    import time
    t0 = time.perf_counter()
    ok, text = _out(check, hangs, lambda x: x, [(1,)], timeout=0.5)
    assert ok is False and "did not return within 0.5 s" in text and time.perf_counter() - t0 < 5


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_notebook_prints_the_answer_its_check_compares_with(nb):
    """Issue 37: the accellib function a check compares the student's with is the exercise's answer; printing its
    source anywhere in the notebook (03 printed run_block's, 02 keep_prob_list's) gives the answer away."""
    _, chk, _ = exercise(nb)
    imported = {n.strip() for line in re.findall(r"^from accellib\S* import \(?([^)\n]*)", chk, re.M)
                for n in line.split(",") if n.strip()}
    srcs = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
    printed = set(re.findall(r"getsource\((?:[\w.]+\.)?(\w+)\)", srcs))
    assert not (printed & (imported - {"check"})), f"{nb.name} prints the source of {printed & imported}"
