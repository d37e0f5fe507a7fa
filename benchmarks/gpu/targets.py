"""Issue 42's targets in one table, each measured value from the record against its target, and the summary printed
at the end. The findings tables' GPU cells (README, docs/results.md) are read from a record of this check by
accellib.analysis.results.gpu_cells, which knows this check by CHECK (a test keeps the two names equal).

A smoke run (a toy model on a CPU) measures every value the same way but judges none: its verdicts say
"smoke" and `passed` is null, so no CPU number is ever read as a GPU result."""
from __future__ import annotations

CHECK = "benchmarks/gpu_check.py (issue 42)"
# key, what is measured, comparison, target (and a stretch target)
TARGETS = (
    ("trainer_vs_plain", "tokens/s of the trainer (train.compile=blocks) / the plain loop, both compiled", ">=", 0.97),
    ("trainer_vs_plain_model", "tokens/s of the trainer (train.compile=model) / the plain loop, both compiled", ">=", 0.97),
    ("mfu", "MFU of the trainer with train.compile=blocks, of the data sheet's bf16 peak", ">=", 0.40, 0.45),
    ("pld@0.5", "PLD at fixed theta 0.5: realized speed-up (time saving / FLOPs saving)", ">=", 0.85),
    ("sbld@0.5", "SBLD at fixed theta 0.5: realized speed-up", ">=", 0.85),
    ("random_ltd@1/2", "random-LTD at kept length 1/2: realized speed-up", ">=", 0.75),
    ("random_ltd@1/8", "random-LTD at kept length 1/8: realized speed-up", ">=", 0.60),
    ("standardization_loss", "standardization loss: tokens/s / the baseline's", ">=", 0.95),
    ("lowp_fp8", "FP8 (torchao): tokens/s / the baseline's (bf16)", ">=", 0.95),
    ("vcycle", "V-cycle (configs/multilevel_gpt_base.yaml): realized speed-up of the predicted whole run", ">=", 0.70),
    ("sync_calls", "synchronizing CUDA calls per step, the most over the points", "==", 0),
    ("graphs_timed", "graphs compiled inside timed steps, summed over the points", "==", 0),
    ("prediction:pld", "short PLD run: measured / predicted seconds", "within", 0.10),
    ("prediction:random_ltd", "short random-LTD run: measured / predicted seconds", "within", 0.10),
)


def measured(rec: dict, key: str):
    """The record's value for a target key, or None when the part it comes from did not run."""
    parts = rec["parts"]
    done = lambda n: parts.get(n) if (parts.get(n) or {}).get("status") == "done" else None  # noqa: E731
    smoke = rec.get("smoke")
    if key.startswith("trainer_vs_plain"):
        name = "accellib+model / plain+compile" if key.endswith("model") else "accellib+compile / plain+compile"
        return ((done("trainer_vs_plain") or {}).get("ratios") or {}).get(name)
    if key == "mfu":
        mfu = ((done("trainer_vs_plain") or {}).get("mfu") or {}).get("accellib+compile") or {}
        return mfu.get("measured" if smoke else "datasheet")
    if key == "lowp_fp8":   # judged only when FP8 ran: with no Linear converted the point times bf16 twice
        pt = done("point:lowp_fp8") or {}
        if str((pt.get("fp8") or {}).get("fp8_layers", "0")).split("/")[0] in ("", "0"):
            return "no Linear converted (no FP8 table for this GPU, or none gains): FP8 not measured" if pt else None
        return (pt.get("vs_baseline") or {}).get("speedup")
    if key == "standardization_loss":
        return ((done(f"point:{key}") or {}).get("vs_baseline") or {}).get("speedup")
    if "@" in key:
        return ((done(f"point:{key}") or {}).get("vs_baseline") or {}).get("realized")
    if key == "vcycle":
        return (((done("predict") or {}).get("configs") or {}).get("multilevel") or {}).get("realized")
    points = [p for n, p in parts.items() if n.startswith("point:") and p.get("status") == "done"]
    points += [lv for lv in ((done("vcycle") or {}).get("levels") or {}).values()]
    if key == "sync_calls":
        counts = [(p.get("sync_calls") or {}).get("per_step") for p in points]
        counts = [v for v in counts if v is not None]
        return max(counts) if counts else None
    if key == "graphs_timed":
        counts = [p["graphs"]["timed"] for p in points if "graphs" in p]
        return sum(counts) if counts else None
    if key.startswith("prediction:"):
        return (done(f"check:{key.split(':')[1]}") or {}).get("ratio")
    raise KeyError(key)


def meets(op: str, value, target) -> bool:
    if op == ">=":
        return value >= target
    if op == "==":
        return value == target
    return abs(value - 1) <= target


def judge(rec: dict) -> list[dict]:
    """Every target with its measured value; `passed` null when not measured, or in a smoke run."""
    out = []
    for key, what, op, target, *stretch in TARGETS:
        v = measured(rec, key)
        t = f"|x - 1| <= {target}" if op == "within" else f"{op} {target}"
        if key == "sync_calls" and v is None and rec.get("smoke"):
            v = "not applicable on CPU"
        row = dict(key=key, what=what, measured=v, target=t)
        if stretch:
            row["stretch"] = f"{op} {stretch[0]}"
        if v is None or isinstance(v, str):
            row["passed"] = None
        elif rec.get("smoke"):
            row.update(passed=None, smoke="measured on a CPU at toy scale: says the machinery works, not a GPU result")
        else:
            row["passed"] = meets(op, v, target)
            if not row["passed"] and op != "==":
                row["missed_by"] = round(target - v if op == ">=" else abs(v - 1) - target, 4)
        out.append(row)
    return out


def summary(rec: dict, path) -> None:
    print(f"\ngpu_check summary ({rec['device']}, {rec['elapsed_s']:.0f} s of the {rec['deadline_s']:.0f} s deadline)")
    for name, p in rec["parts"].items():
        extra = ""
        if p.get("mean_step_s"):
            extra = f"  {p['mean_step_s'] * 1e3:9.2f} ms/step"
            if (p.get("vs_baseline") or {}).get("realized") is not None:
                extra += f"  realized {p['vs_baseline']['realized']:.3f}"
        print(f"  {name:<28}{p.get('status', ''):>8}{p.get('seconds', 0):>8.1f} s{extra}")
    for name, why in rec["skipped"].items():
        print(f"  skipped {name}: {why}")
    if rec.get("smoke"):
        print("  (smoke run: a toy model for a few steps on a CPU; nothing below is judged, and its numbers say "
              "nothing about a GPU)")
    for v in rec["verdicts"]:
        word = ("SMOKE" if v.get("smoke") else "NOT MEASURED") if v["passed"] is None else \
            ("PASS" if v["passed"] else "MISSED")
        m = v["measured"]
        m = f"{m:.4g}" if isinstance(m, float) else m
        print(f"  {word:<13}{v['what']}: {m} (target {v['target']})")
    print(f"wrote {path}", flush=True)
