"""Every notebook's header states how long it runs on an idle and on a busy machine, as measured by
benchmarks/notebook_times.py (results/notebook_times.json), not as estimated (issue 28)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("notebook_times", ROOT / "benchmarks" / "notebook_times.py")


def test_every_header_states_the_measured_times():
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = json.loads((ROOT / "results" / "notebook_times.json").read_text())
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(res["notebooks"]) == names, "measure the new notebooks: python benchmarks/notebook_times.py --notebooks NN"
    for name in names:
        t = res["notebooks"][name]
        loaded = sorted((int(k), v) for k, v in t["loaded_s"].items())
        assert 0 < t["idle_s"] and len(loaded) >= 2 and all(v > 0 for _, v in loaded)   # a range under load
        head = "".join(json.loads((ROOT / "notebooks" / name).read_text())["cells"][0]["source"])
        assert mod.runtime_line(t, res["cores"]).strip() in head, f"{name}: header lacks its measured runtime line"
        assert head.count("**Runtime:**") == 1
