"""lm-evaluation-harness on a run (issue 14): offline tasks from the held-out split, exact scores."""
import json
import math

import pytest
import torch

pytest.importorskip("lm_eval", reason="pip install -e '.[hf]' (make test installs it)")

from accellib.evaluate import (cloze_context, cloze_items, frequency_baseline, main as evaluate_main,  # noqa: E402
                               ppl_docs, validation_text)
from accellib.core.records import read_record  # noqa: E402
from accellib.train import training_function  # noqa: E402


@pytest.fixture(scope="module")
def trained(tiny_data_dir, tmp_path_factory):
    from accellib.core.config import load_config
    from conftest import tiny_overrides
    run = tmp_path_factory.mktemp("eval") / "run"
    training_function(load_config(None, tiny_overrides(tiny_data_dir, **{"train.steps": 20})), run)
    return run


def test_task_documents_are_the_validation_split(tiny_data_dir):
    text = validation_text(tiny_data_dir)
    docs = ppl_docs(text, size=500)
    assert "".join(d["text"] for d in docs) == text and all(d["text"].endswith("\n") for d in docs[:-1])
    items = cloze_items(text, n=50, context=60)
    assert len(items) >= 40
    for it in items:
        answer = it["choices"][it["label"]]
        at = text.find(it["context"] + " " + answer)
        assert at >= 0 and len(it["context"]) == 60                      # the passage, then the answer
        assert len({len(c) for c in it["choices"]}) == 1 and len({c.lower() for c in it["choices"]}) == 4
        assert all(f" {c}" in text for c in it["choices"])                 # distractors are words of the split
    assert cloze_items(text, n=50, context=60) == items                  # deterministic


def own_bits_per_byte(run, text):
    """What lm-eval's rolling log-likelihood must give, computed with accellib's own model: disjoint
    windows of seq_len predictions, each conditioned on the token before it (the first on a newline)."""
    from accellib.export import run_weights
    from accellib.models.transformer import Transformer
    cfg, sd, _ = run_weights(run)
    m = Transformer(cfg.model).eval()
    m.load_state_dict(sd)
    ids, T = list(text.encode()), cfg.model.seq_len
    full = [10] + ids                                                    # the newline prefix
    nll = 0.0
    with torch.no_grad():
        for s in range(0, len(ids), T):
            x = torch.tensor([full[s:s + min(T, len(ids) - s)]])
            y = torch.tensor([ids[s:s + T]])
            nll += torch.nn.functional.cross_entropy(m(x)[0][0], y[0], reduction="sum").item()
    return nll / len(ids) / math.log(2)


def test_lm_eval_scores_what_accellib_computes(trained, tiny_data_dir, capsys):
    assert evaluate_main([str(trained), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "corpus_cloze  acc" in out and "bits_per_byte" in out and "acc_frequency_rule" in out
    rec = read_record(trained)
    assert rec["final"]["val_loss"] > 0 and rec["lm_eval_info"]["n_docs"] == {"corpus_ppl": 2, "corpus_cloze": 2}
    docs = ppl_docs(validation_text(tiny_data_dir))[:2]
    # the harness's bits per byte over 2 documents: sum of both NLLs over both byte counts
    n = [len(d["text"].encode()) for d in docs]
    expect = sum(own_bits_per_byte(trained, d["text"]) * k for d, k in zip(docs, n)) / sum(n)
    assert rec["lm_eval"]["corpus_ppl"]["bits_per_byte"] == pytest.approx(expect, rel=1e-4)
    assert 0 <= rec["lm_eval"]["corpus_cloze"]["acc"] <= 1
    text = validation_text(tiny_data_dir)                                # the context-free rule, beside the model
    items = cloze_items(text, context=cloze_context(32, 1.0))[:2]
    assert rec["lm_eval"]["corpus_cloze"]["acc_frequency_rule"] == frequency_baseline(text, items)
    assert (trained / "hf" / "model.safetensors").is_file()


def test_evaluation_refusals_are_one_line(trained, tiny_cfg, tmp_path, capsys):
    assert evaluate_main([str(trained), "--tasks", "no_such_task", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown lm-eval task(s) no_such_task" in err and err.count("\n") == 1
    assert evaluate_main([str(tmp_path / "nothing")]) == 2
    assert "has no record.json" in capsys.readouterr().err
    mlm = tmp_path / "mlm"
    training_function(tiny_cfg(**{"train.steps": 1, "model.kind": "mlm"}), mlm)
    before = (mlm / "record.json").read_text()
    assert evaluate_main([str(mlm)]) == 2
    assert "no GPT-2 counterpart" in capsys.readouterr().err
    assert (mlm / "record.json").read_text() == before


def test_compare_adds_lm_eval_per_arm(tiny_data_dir, tmp_path, capsys):
    import yaml
    from accellib.compare import main as compare_main
    cfg = tmp_path / "arms.yaml"
    cfg.write_text(yaml.safe_dump(dict(arms=dict(baseline={}, pld={"pld": {"enabled": True}}))))
    from conftest import tiny_overrides
    assert compare_main(["--config", str(cfg), "--out", str(tmp_path / "cmp"), "--lm-eval", "--lm-eval-limit", "2",
                         *tiny_overrides(tiny_data_dir)]) == 0
    out = capsys.readouterr().out
    assert "lm-evaluation-harness" in out and "corpus_cloze acc" in out
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert set(summary["lm_eval"]) == {"baseline", "pld"}
    for arm in ("baseline", "pld"):
        assert summary["lm_eval"][arm]["corpus_ppl bits_per_byte"] == [
            read_record(tmp_path / "cmp" / arm)["lm_eval"]["corpus_ppl"]["bits_per_byte"]]


def test_evaluation_of_a_run_another_process_writes_is_refused(trained, capsys):
    # a training (or a second evaluation) holding the run folder would race on record.json
    import subprocess
    import sys
    hold = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                             "from accellib.core.run_dir import lock_run; assert lock_run(Path(sys.argv[1])) is None; "
                             "print('held', flush=True); time.sleep(60)", str(trained)], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout.readline().strip() == "held"
        before = (trained / "record.json").read_text()
        assert evaluate_main([str(trained), "--limit", "1"]) == 2
        assert "another process" in capsys.readouterr().err
        assert (trained / "record.json").read_text() == before
    finally:
        hold.kill()
        hold.wait()


def test_frequency_rule_picks_the_most_frequent_choice():
    text = "x aaaa aaaa aaaa bbbb bbbb cccc dddd"
    items = [dict(choices=["bbbb", "aaaa", "cccc", "dddd"], label=1), dict(choices=["aaaa", "bbbb"], label=1)]
    assert frequency_baseline(text, items) == 0.5


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_a_limit_below_one_is_one_line(limit, trained, capsys):
    # issue 26 item 7: before, both ended in a traceback (exit 1) inside the harness
    before = (trained / "record.json").read_text()
    assert evaluate_main([str(trained), "--limit", limit]) == 2
    err = capsys.readouterr().err
    assert f"--limit {limit}" in err and "at least 1" in err and err.count("\n") == 1
    assert (trained / "record.json").read_text() == before


def test_evaluation_outside_a_git_checkout_prints_no_git_error(trained, tmp_path, monkeypatch, capfd):
    """lm-eval asks git for a version; outside a checkout git wrote 'fatal: not a git repository' to the
    process's stderr, a red block in notebook 00 (issue 28)."""
    import subprocess
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))   # git must not find a checkout above
    assert subprocess.run(["git", "rev-parse"], capture_output=True).returncode != 0
    assert evaluate_main([str(trained), "--limit", "1"]) == 0
    err = capfd.readouterr().err
    assert "fatal" not in err and "not a git repository" not in err


@pytest.mark.parametrize("args,msg", [(["--tasks", ""], "names no task"), (["--tasks", "corpus_ppl,"], "an empty one"),
                                      (["--batch-size", "0"], "--batch-size 0"), (["--device", "foo"], "is not a device"),
                                      (["--device", "cuda"], "no CUDA GPU here"), (["--device", "cuda:7"], "no CUDA GPU")])
def test_bad_evaluate_arguments_are_one_line(args, msg, trained, capsys, monkeypatch):
    # issue 36 item 6: before, --tasks "" and --batch-size 0 ended in tracebacks, --device cuda on a CPU-only torch
    # too, and a bogus --device ran (exit 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = (trained / "record.json").read_text()
    assert evaluate_main([str(trained), "--limit", "1", *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert (trained / "record.json").read_text() == before
