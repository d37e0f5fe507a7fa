"""The check's record, clock and deadline: a JSON rewritten atomically after every change, an alarm that stops a
part at the deadline less half the margin, a part skipped when its estimate does not fit, and the plan."""
from __future__ import annotations

import signal
import time
import traceback
from pathlib import Path

T_START = time.monotonic()


class Deadline(BaseException):
    """The alarm at the deadline (less half the margin) went off during a part (a BaseException, so that no
    `except Exception` inside torch swallows it)."""


class Skip(Exception):
    """A part that cannot run here (e.g. its data or package is missing); the message says why."""


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
        self.path, self.data = path, dict(head, finished=False, parts={}, skipped={}, verdicts=[])
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
        self.data["parts"][name] = value
        self.save()

    def get(self, name: str) -> dict | None:
        return self.data["parts"].get(name)

    def done(self, name: str) -> dict | None:
        p = self.get(name)
        return p if p and p.get("status") == "done" else None

    def skip(self, name: str, why: str) -> None:
        self.data["skipped"][name] = why
        print(f"gpu_check: skipped {name}: {why}", flush=True)
        self.save()

    def verdict(self, v: dict) -> None:
        self.data["verdicts"].append(v)
        self.save()


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
    import gc

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


ROOT = Path(__file__).resolve().parents[2]


def rel(p: Path) -> Path:
    """`p` relative to the repository when inside it (the records hold no machine paths)."""
    p = Path(p).resolve()
    return p.relative_to(ROOT) if p.is_relative_to(ROOT) else p
