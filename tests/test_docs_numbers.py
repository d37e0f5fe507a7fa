"""Every paired interval the README and docs/ quote, "+0.233 [+0.198, +0.268]", is one the cache gives (issue 29):
either stored in a results/*.json record, or the paired gap (same seed = a pair, `accellib.analysis.stats`) of
  - two arms of one stored comparison (per-seed lists of equal length, paired by position);
  - two arms of any two stored comparisons, on the seeds both ran (rows that name their seeds, `seed_labels`),
    e.g. an Ouroboros arm of tutorial_ouroboros_lr against the dense frontier of tutorial_flops on the shared seeds;
  - two quantities a benchmark stores per seed (PER_SEED_GAPS), e.g. the V-cycle's final loss against the
    baseline's at equal FLOPs.
A number copied by hand that drifts from its cache fails here."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from accellib.analysis.stats import paired

ROOT = Path(__file__).resolve().parents[1]
TRIPLE = re.compile(r"([+\-−]?\d+\.\d+)\s*\[([+\-−]?\d+\.\d+),\s*([+\-−]?\d+\.\d+)\]")


def num(s: str) -> float:
    return float(s.replace("−", "-"))


# per-seed records (a list of dicts with a "seed"): (technique's value, baseline's value at the same budget)
PER_SEED_GAPS = [
    ("ltd_final", "base_final"),                 # random_ltd_cpu.json: random-LTD vs the baseline at equal LayerTokens
    ("ml_final", "base_at_equal_flops"),         # multilevel_cpu.json: the V-cycle vs the baseline at equal FLOPs
    ("small_end", "base_at_small_end"),          # multilevel_cpu.json: the small model's end vs the baseline there
]


def per_seed_values(row: dict) -> list[float] | None:
    """A comparison row's per-seed metric: val_losses, val_accs (or the standardization benchmark's val_losss)."""
    for k, v in row.items():
        if (k.startswith("val_") and isinstance(v, list) and len(v) > 1
                and all(isinstance(x, (int, float)) for x in v)):
            return v
    return None


def cached_intervals() -> list[tuple[float, float, float]]:
    """(mean, lo, hi) of every interval a result stores, of every pair of arms of one stored comparison, of every
    pair of arms of two comparisons on their shared seeds, and of every PER_SEED_GAPS pair."""
    out = []
    labelled = []       # (metric name, {seed label: value}) of every row that names its seeds

    def add(p):
        out.append((p.mean, p.lo, p.hi))

    def walk(o):
        if isinstance(o, dict):
            if {"mean", "lo", "hi"} <= o.keys() and all(isinstance(o[k], (int, float)) for k in ("mean", "lo", "hi")):
                out.append((o["mean"], o["lo"], o["hi"]))
            rows = o.get("rows")
            if isinstance(rows, list):
                losses = [per_seed_values(r) for r in rows if isinstance(r, dict)]
                for a, b in itertools.permutations([x for x in losses if x], 2):
                    if len(a) == len(b):
                        add(paired(a, b))
                for r in rows:
                    v = per_seed_values(r) if isinstance(r, dict) else None
                    labels = r.get("seed_labels") if v else None
                    if isinstance(labels, list) and len(labels) == len(v):
                        metric = next(k for k in r if r[k] is v)
                        labelled.append((metric, dict(zip(labels, v))))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            by_seed = {}
            for v in o:
                if isinstance(v, dict) and "seed" in v:
                    by_seed.setdefault(v["seed"], v)        # one record per seed (to_target repeats a seed per target)
            for a, b in PER_SEED_GAPS:
                recs = [r for r in by_seed.values() if isinstance(r.get(a), (int, float))
                        and isinstance(r.get(b), (int, float))]
                if len(recs) > 1:
                    add(paired([r[a] for r in recs], [r[b] for r in recs]))
            for v in o:
                walk(v)

    for path in sorted((ROOT / "results").glob("*.json")):
        walk(json.loads(path.read_text()))
    for (ma, a), (mb, b) in itertools.permutations(labelled, 2):
        shared = [s for s in a if s in b]
        if ma == mb and len(shared) > 1:
            add(paired([a[s] for s in shared], [b[s] for s in shared]))
    return out


def matches(quoted: tuple[str, str, str], got: tuple[float, float, float]) -> bool:
    for q, g in zip(quoted, got):
        places = len(q.split(".")[1])
        if abs(num(q) - g) > 0.5 * 10 ** -places + 1e-9:
            return False
    return True


def test_every_quoted_interval_is_the_caches():
    known = cached_intervals()
    assert known
    bad = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in TRIPLE.finditer(page.read_text()):
            q = m.groups()
            if not any(matches(q, k) for k in known):
                bad.append(f"{page.relative_to(ROOT)}: {m.group(0)}")
    assert not bad, "intervals no cached result gives:\n" + "\n".join(bad)


def test_the_trainer_vs_plain_ratio_is_stated_once_and_from_the_cache():
    """Issue 29: the docs gave the trainer-vs-plain-loop ratio as both 0.989x and 1.014x and its target as both
    >= 0.95 and >= 0.97. Every statement of either must be results/throughput_cpu.json's."""
    res = json.loads((ROOT / "results" / "throughput_cpu.json").read_text())
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    ratios = set(re.findall(r"(\d\.\d{3})\**[x×]\** (?:of )?(?:the|its) tokens/s", text))
    targets = set(re.findall(r"(?:target|keeps) (?:>=|≥) (0\.\d+)", text))
    assert ratios == {f"{res['ratio']:.3f}"}, ratios
    assert targets == {f"{res['target']:g}"}, targets
