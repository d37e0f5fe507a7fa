"""How long each notebook takes to run, on an idle and on a busy machine; the numbers every notebook's header states.

    python benchmarks/notebook_times.py                      # every notebook, idle then busy (about 20 min on 2 cores)
    python benchmarks/notebook_times.py --notebooks 03,07    # some; the others keep their stored times
    python benchmarks/notebook_times.py --write-headers      # put the stored times into each header's runtime line

Each notebook runs headless in a fresh kernel with the environment of `make test` (OMP_NUM_THREADS=1), once with
nothing else running ("idle") and once beside one CPU-bound program per core, each in its own session like the
kernel ("busy": what a student sees when a second notebook or another program runs at the same time). The idle run writes the
notebook's outputs back (it is also the notebook's re-execution); the busy run only times. Results go to
results/notebook_times.json; tests/test_notebook_times.py checks that every header states them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's accellib, installed or not (as every benchmark)
from accellib.core.records import environment, write_json  # noqa: E402

OUT = ROOT / "results" / "notebook_times.json"
HEADER = re.compile(r"\*\*Runtime:\*\*[^\n]*\n?")


def timed(path: Path, write: bool, busy: int, limit: float = 900.0) -> float:
    """Seconds to execute the notebook headless, in a process of its own (a client that hangs, as one did twice
    under load with a kernel waiting for requests, is killed after `limit` s and the run tried once more)."""
    # the CPU-bound processes are fresh interpreters, each in a session of its own like the kernel: Linux shares
    # the CPU between sessions first (autogroups), so hogs in one session would take only one share
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(busy)]
    try:
        for attempt in (1, 2):
            t0 = time.perf_counter()
            cmd = [sys.executable, str(ROOT / "tests" / "execute_notebooks.py"), *([] if write else ["--no-write"]),
                   str(path)]
            try:
                subprocess.run(cmd, check=True, timeout=limit, start_new_session=True)
                return time.perf_counter() - t0
            except subprocess.TimeoutExpired:
                print(f"{path.name}: no result after {limit:.0f} s (attempt {attempt}); killed", flush=True)
        raise RuntimeError(f"{path.name} did not finish twice")
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def runtime_line(t: dict, cores: int, hogs: int) -> str:
    return (f"**Runtime:** {round(t['idle_s'])} s on an idle {cores}-core machine, {round(t['busy_s'])} s on a busy one "
            f"({hogs} CPU-bound processes beside it), measured by `benchmarks/notebook_times.py`.\n")


def write_headers(times: dict, cores: int, hogs: int) -> None:
    for name, t in times.items():
        path = ROOT / "notebooks" / name
        nb = json.loads(path.read_text())
        head = "".join(nb["cells"][0]["source"])
        line = runtime_line(t, cores, hogs)
        if HEADER.search(head):
            head = HEADER.sub(line, head, count=1)
        else:   # after the navigation line (the header's first link line)
            lines = head.splitlines(True)
            at = next(i for i, s in enumerate(lines) if s.startswith("[")) + 1
            head = "".join(lines[:at] + ["\n", line] + lines[at:])
        nb["cells"][0]["source"] = head.splitlines(True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {line.strip()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notebooks", help="comma-separated number prefixes (e.g. 03,07); default every notebook")
    ap.add_argument("--write-headers", action="store_true", help="only write the stored times into the headers")
    ap.add_argument("--only", choices=["idle", "busy"], help="measure one of the two (the other keeps its stored time)")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2,
                    help="CPU-bound processes beside the busy run (default: one per core)")
    args = ap.parse_args()
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    times, cores = old.get("notebooks", {}), old.get("cores", os.cpu_count() or 2)
    hogs = old.get("busy_processes", args.hogs)
    if not args.write_headers:
        want = args.notebooks.split(",") if args.notebooks else None
        paths = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                 if want is None or p.name[:2] in want]
        os.environ["OMP_NUM_THREADS"] = "1"
        for p in paths:
            t = times.setdefault(p.name, {})
            if args.only != "busy":
                t["idle_s"] = round(timed(p, write=True, busy=0), 1)
            if args.only != "idle":
                t["busy_s"] = round(timed(p, write=False, busy=args.hogs), 1)
            print(f"{p.name}: " + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in t.items()), flush=True)
            cores, hogs = os.cpu_count() or 2, args.hogs if args.only != "idle" else old.get("busy_processes", args.hogs)
            write_json(OUT, dict(command="python benchmarks/notebook_times.py", cores=cores, busy_processes=hogs,
                                 environment=environment(), notebooks=times))     # after each: a crash keeps the rest
    write_headers(times, cores, hogs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
