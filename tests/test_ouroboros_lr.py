"""The LR check of notebook 06 (results/tutorial_ouroboros_lr.json, configs/ouroboros_lr.yaml): Ouroboros at lower
peak LRs and longer warm-ups. Its config must keep the shared tutorial base, its cached record must hold every arm
of the config at the seeds of tutorial_ouroboros (so seeds pair across the two records), and its stored paired gaps
must be what the course's rule (accellib.analysis.stats) gives from the stored per-seed losses."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from accellib.analysis.stats import paired

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ouroboros_lr.yaml"
RESULT = ROOT / "results" / "tutorial_ouroboros_lr.json"
VARIANT = re.compile(r"^(baseline|ouroboros_k\d)@lr([0-9.e-]+)_wu(\d+)$")


def base(path: Path) -> dict:
    return {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "arms"}


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RESULT.read_text())


def test_the_config_keeps_the_tutorial_base_and_names_what_each_arm_changes():
    assert base(CONFIG) == base(ROOT / "configs" / "ouroboros.yaml") == base(ROOT / "configs" / "tutorial.yaml")
    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "benchmarks" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    assert reproduce.same_base(CONFIG) == CONFIG          # the check reproduce.py runs before training
    arms = yaml.safe_load(CONFIG.read_text())["arms"]
    assert arms["baseline"] == {}                         # the tuned baseline: the paired control
    for name, over in arms.items():
        if name == "baseline":
            continue
        arm, lr, wu = VARIANT.match(name).groups()        # <arm>@lr<peak LR>_wu<warm-up>: the name says the setting
        assert over["optim"] == {"lr": float(lr), "warmup_steps": int(wu)}, name
        k = over.get("ouroboros", {}).get("modules", 1)
        assert arm == ("baseline" if k == 1 else f"ouroboros_k{k}"), name
        assert over.get("ouroboros", {}).get("enabled", False) == (k > 1), name


def test_the_record_holds_every_arm_at_the_seeds_of_tutorial_ouroboros(record):
    ref = json.loads((ROOT / "results" / "tutorial_ouroboros.json").read_text())
    assert record["config"] == yaml.safe_load(CONFIG.read_text())       # the record stores the config it ran
    assert record["budget"]["seed0"] == ref["budget"]["seed0"] and record["budget"]["budget"] == "steps"
    seeds = [f"seed{ref['budget']['seed0'] + k}" for k in range(ref["summary"]["seeds"])]
    rows = {r["arm"]: r for r in record["summary"]["rows"]}
    assert set(rows) == set(record["config"]["arms"])
    for arm, r in rows.items():
        assert r["seeds"] >= 3 and r["seed_labels"] == seeds, arm
        assert sorted(k for k in record["curves"] if k.split("/")[0] == arm) == [f"{arm}/{s}" for s in seeds]
    # the same baseline runs as tutorial_ouroboros's, seed for seed (same code, config and seed)
    ref_base = next(r for r in ref["summary"]["rows"] if r["arm"] == "baseline")["val_losses"]
    assert max(abs(a - b) for a, b in zip(rows["baseline"]["val_losses"], ref_base)) < 1e-3


def test_the_stored_paired_gaps_follow_from_the_stored_losses(record):
    rows = {r["arm"]: r for r in record["summary"]["rows"]}
    base_by_seed = dict(zip(rows["baseline"]["seed_labels"], rows["baseline"]["val_losses"]))
    checked = 0
    for arm, r in rows.items():
        if arm == "baseline":
            continue
        again = paired(r["val_losses"], [base_by_seed[s] for s in r["seed_labels"]])
        stored = r["vs_baseline"]
        assert stored["verdict"] == again.verdict and stored["n"] == again.n, arm
        for key in ("mean", "lo", "hi", "se"):
            assert stored[key] == pytest.approx(getattr(again, key), abs=1e-12), (arm, key)
        checked += 1
    assert checked == len(rows) - 1
