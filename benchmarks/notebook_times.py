"""How long each notebook takes to run, on an idle and on a busy machine; the numbers every notebook's header states.

    python benchmarks/notebook_times.py                      # every notebook, idle then busy (about 20 min on 2 cores)
    python benchmarks/notebook_times.py --notebooks 03,07    # some; the others keep their stored times
    python benchmarks/notebook_times.py --write-headers      # put the stored times into each header's runtime line

Each notebook runs headless in a fresh kernel with the environment of `make test` (OMP_NUM_THREADS=1), once with
nothing else running ("idle") and once beside as many CPU-bound processes as the machine has cores ("busy":
what a student sees when the test suite or a second notebook runs at the same time). The idle run writes the
notebook's outputs back (it is also the notebook's re-execution); the busy run only times. Results go to
results/notebook_times.json; tests/test_notebook_times.py checks that every header states them.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from execute_notebooks import execute  # noqa: E402

from accellib.core.records import environment, write_json  # noqa: E402

OUT = ROOT / "results" / "notebook_times.json"
HEADER = re.compile(r"\*\*Runtime:\*\*[^\n]*\n?")


def burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def timed(path: Path, write: bool, busy: int) -> float:
    stop = mp.Event()
    hogs = [mp.Process(target=burn, args=(stop,), daemon=True) for _ in range(busy)]
    for h in hogs:
        h.start()
    try:
        t0 = time.perf_counter()
        execute(str(path), write=write)
        return time.perf_counter() - t0
    finally:
        stop.set()
        for h in hogs:
            h.join()


def runtime_line(t: dict, cores: int) -> str:
    return (f"**Runtime:** {round(t['idle_s'])} s on an idle {cores}-core machine, {round(t['busy_s'])} s on a busy one "
            f"({cores} CPU-bound processes beside it), measured by `benchmarks/notebook_times.py`.\n")


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
    args = ap.parse_args()
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    times, cores = old.get("notebooks", {}), old.get("cores", os.cpu_count() or 2)
    if not args.write_headers:
        want = args.notebooks.split(",") if args.notebooks else None
        paths = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                 if want is None or p.name[:2] in want]
        os.environ["OMP_NUM_THREADS"] = "1"
        for p in paths:
            idle = timed(p, write=True, busy=0)
            busy = timed(p, write=False, busy=os.cpu_count() or 2)
            times[p.name] = dict(idle_s=round(idle, 1), busy_s=round(busy, 1))
            print(f"{p.name}: idle {idle:.0f} s, busy {busy:.0f} s", flush=True)
        cores = os.cpu_count() or 2
        write_json(OUT, dict(command="python benchmarks/notebook_times.py", cores=cores, busy_processes=cores,
                             environment=environment(), notebooks=times))
    write_headers(times, cores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
