"""One visual language (issue 28): one colour per arm and per named series across the course, none shared, and
notebooks draw named series only through the registry (accellib.analysis.plotting.ARM_COLORS via arm_color)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.colors as mcolors
import yaml

from accellib.analysis.plotting import ARM_COLORS, _SPARE, arm_color, arm_family

ROOT = Path(__file__).resolve().parents[1]


def course_arms() -> set[str]:
    """Every arm a config or a cached result of the course names."""
    arms = set()
    for p in (ROOT / "configs").glob("*.yaml"):
        arms |= set((yaml.safe_load(p.read_text()) or {}).get("arms") or {})
    for p in (ROOT / "results").glob("*.json"):
        def walk(o):
            if isinstance(o, dict):
                if isinstance(o.get("rows"), list):
                    arms.update(r["arm"] for r in o["rows"] if isinstance(r, dict) and "arm" in r)
                for v in o.values():
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(json.loads(p.read_text()))
    return arms


def test_no_two_registered_names_share_a_colour():
    rgb = {}
    for name, c in ARM_COLORS.items():
        key = mcolors.to_hex(c)
        assert key not in rgb, f"{name} and {rgb[key]} share {key}"
        rgb[key] = name
    assert not set(rgb) & {mcolors.to_hex(c) for c in _SPARE}


def test_every_arm_of_the_course_is_registered():
    missing = sorted(a for a in course_arms() if arm_family(a) not in ARM_COLORS)
    assert not missing, f"arms with no colour in accellib.analysis.plotting.ARM_COLORS: {missing}"


def test_variants_and_seeds_take_their_arms_colour():
    assert arm_color("pld 0.7") == arm_color("pld/seed1338") == arm_color("pld@lr1e-3/seed3") == ARM_COLORS["pld"]
    assert arm_color("sbld+random_ltd/seed1") == ARM_COLORS["sbld+random_ltd"]
    assert arm_color("someone_elses_arm") in _SPARE
    assert arm_color("lr0.003_wu20/seed1337") == ARM_COLORS["baseline"]     # notebook 00's LR sweep
    assert arm_color("lr0.00125/seed1341") == ARM_COLORS["baseline"]        # ot_lr_check: the baseline at another LR


# a colour given by hand in a notebook: a hex that is not a grey, a palette index, a categorical colour map
HAND_COLOUR = re.compile(r"#(?!([0-9a-fA-F]{2})\1\1\b)[0-9a-fA-F]{6}\b|\bCOLORS\[|[\"']C\d[\"']|f[\"']C\{|tab10|tab20|Set[123]\b")


def test_notebooks_colour_named_series_through_the_registry():
    offenders = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, c in enumerate(json.loads(nb.read_text())["cells"]):
            if c["cell_type"] == "code":
                for line in "".join(c["source"]).splitlines():
                    if HAND_COLOUR.search(line.split("  # ")[0]):   # a trailing comment may name a colour
                        offenders.append(f"{nb.name} cell {i}: {line.strip()[:100]}")
    assert not offenders, "colours set by hand (use accellib.analysis.plotting.arm_color):\n" + "\n".join(offenders)
