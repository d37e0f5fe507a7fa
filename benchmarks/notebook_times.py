"""How long each notebook takes to run, idle and under load; the numbers every notebook's header states.

    python benchmarks/notebook_times.py                      # every notebook: idle, then beside 2 and 4 CPU-bound
                                                             # programs (about an hour on 2 cores)
    python benchmarks/notebook_times.py --notebooks 03,07    # some; the others keep their stored times
    python benchmarks/notebook_times.py --write-headers      # put the stored times into each header's runtime line

Each notebook runs headless in a fresh kernel with the environment of `make test` (OMP_NUM_THREADS=1), once with
nothing else running ("idle") and once beside each number of CPU-bound programs in `--loads` (default 2 and 4,
each in its own session like the kernel: what a student sees when other notebooks or programs run at the same
time; on a 2-core machine 4 of them is a load of about 5). A Run All on a shared machine takes what its load
gives it: the range is the header's point, not one "busy" figure. The idle run writes the notebook's outputs back
(it is also the notebook's re-execution); the loaded runs only time. Results go to results/notebook_times.json;
tests/test_notebook_times.py checks that every header states them.
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


def runtime_line(t: dict, cores: int) -> str:
    loads = sorted(t.get("loaded_s", {}).items(), key=lambda kv: int(kv[0]))
    under = " and ".join(f"{round(v)} s beside {k}" for k, v in loads)
    return (f"**Runtime:** {round(t['idle_s'])} s on an idle {cores}-core machine; {under} CPU-bound programs (the "
            f"time grows with the machine's load), measured by `benchmarks/notebook_times.py`.\n")


def write_headers(times: dict, cores: int) -> None:
    for name, t in times.items():
        path = ROOT / "notebooks" / name
        nb = json.loads(path.read_text())
        head = "".join(nb["cells"][0]["source"])
        line = runtime_line(t, cores)
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
    ap.add_argument("--loads", default="2,4", help="numbers of CPU-bound programs beside the loaded runs (default 2,4)")
    ap.add_argument("--only", choices=["idle", "loaded"], help="measure one kind (the other keeps its stored times)")
    args = ap.parse_args()
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    times, cores = old.get("notebooks", {}), old.get("cores", os.cpu_count() or 2)
    loads = [int(x) for x in args.loads.split(",") if x]
    if not args.write_headers:
        want = args.notebooks.split(",") if args.notebooks else None
        paths = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                 if want is None or p.name[:2] in want]
        os.environ["OMP_NUM_THREADS"] = "1"
        for p in paths:
            t = times.setdefault(p.name, {})
            t.pop("busy_s", None)                      # the one-level record before issue 45
            if args.only != "loaded":
                t["idle_s"] = round(timed(p, write=True, busy=0), 1)
            if args.only != "idle":
                t["loaded_s"] = {str(k): round(timed(p, write=False, busy=k), 1) for k in loads}
            print(f"{p.name}: idle {t['idle_s']:.0f} s, " + ", ".join(f"{v:.0f} s beside {k}" for k, v in
                                                                  t.get("loaded_s", {}).items()), flush=True)
            cores = os.cpu_count() or 2
            write_json(OUT, dict(command="python benchmarks/notebook_times.py", cores=cores,
                                 environment=environment(), notebooks=times))     # after each: a crash keeps the rest
    write_headers(times, cores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
