"""lm-evaluation-harness on a run: export it (accellib/export.py), then score it with the harness.

    python -m accellib.evaluate RUN_DIR                          # the two offline tasks below
    python -m accellib.evaluate RUN_DIR --tasks lambada_openai   # any harness task (downloads its data)
    python -m accellib.evaluate RUN_DIR --limit 100              # the first 100 documents of each task

Two harness tasks are made from the held-out split of the run's own corpus (data.path), so the
harness runs with no network:
  corpus_ppl    `loglikelihood_rolling` over the validation text cut into documents of about 2,000
                characters at line ends: bits_per_byte, byte_perplexity, word_perplexity (as wikitext).
  corpus_cloze  4-way multiple choice: a passage of the validation text, and which of four words of the
                same length comes next; the three distractors are other words of the split. Chance is
                25% (acc). (The harness's acc_norm, which divides by each choice's length, would equal acc.)
The task files (JSON lines + the harness YAML) are written to a temporary folder per evaluation.

The table is printed and stored in the run's record.json under "lm_eval". The exported model is kept
in RUN_DIR/hf. Byte and BPE corpora have no end-of-text token, so rolling log-likelihoods start after
a newline (the corpus's own separator) instead of GPT-2's <|endoftext|>.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import tempfile
from pathlib import Path

from . import install_hint, prog
from .core.options import ConfigError
from .models.hf_gpt2 import ExportError, quiet_transformers
from .export import export_run

LOCAL_TASKS = ("corpus_ppl", "corpus_cloze")
DOC_CHARS = 2000        # corpus_ppl document length (cut at the next line end)
CLOZE_ITEMS = 500       # corpus_cloze questions, spread evenly over the split
CLOZE_CONTEXT = 400     # at most this many characters of passage before each answer (less when the model's
                        # context holds less: see cloze_context)


class EvaluateError(RuntimeError):
    """The evaluation cannot run; the message is one line."""



def _git_describe() -> str | None:
    """What lm-eval records as its `git_hash` (`git describe --always` in the working folder), with git's
    stderr discarded: outside a checkout git prints 'fatal: not a git repository', a red block in a notebook."""
    import subprocess
    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def _quiet_git(lm_eval):
    """lm-eval's evaluator with `_git_describe` in place of its own git call, where that call is where we expect it."""
    from unittest import mock
    evaluator = getattr(lm_eval, "evaluator", None)
    if evaluator is None or not hasattr(evaluator, "get_git_commit_hash"):
        return contextlib.nullcontext()
    return mock.patch.object(evaluator, "get_git_commit_hash", _git_describe)

def check_device(device: str) -> None:
    """The device the harness scores on exists here (one-line EvaluateError otherwise): a device torch cannot
    parse, or a GPU this machine does not have, used to fail deep in the harness or fall back without a word."""
    import torch
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise EvaluateError(f"--device {device!r} is not a device; give cpu, cuda or cuda:N") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise EvaluateError(f"--device {device} but torch sees no CUDA GPU here (this torch is "
                                f"{torch.__version__}); score on the CPU with --device cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise EvaluateError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s), cuda:0 to "
                                f"cuda:{torch.cuda.device_count() - 1}")
    elif d.type == "mps":
        if not torch.backends.mps.is_available():
            raise EvaluateError(f"--device {device} but torch sees no Apple GPU (MPS) here; use --device cpu")
    elif d.type != "cpu":
        raise EvaluateError(f"--device {device}: accellib.evaluate scores on cpu, cuda[:N] or mps")


def validation_text(data_path: str | Path) -> str:
    """The held-out split of a token folder as text (bytes decoded, or the folder's tokenizer decoding)."""
    from .data.tokens import load_token_data
    d = load_token_data(data_path)
    ids = d.val.tolist()
    if d.meta["tokenizer"] == "byte":
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(Path(data_path) / "tokenizer.json")).decode(ids, skip_special_tokens=True)


def ppl_docs(text: str, size: int = DOC_CHARS) -> list[dict]:
    docs, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        if text[start:end].strip():
            docs.append(dict(text=text[start:end]))
        start = end
    return docs


def cloze_items(text: str, n: int = CLOZE_ITEMS, context: int = CLOZE_CONTEXT, seed: int = 0) -> list[dict]:
    """Passages ending just before a word of >= 4 letters that follows a space, and four candidate words of
    that length; deterministic in (text, n, seed).

    The three distractors are drawn from the split's word *occurrences* (a word as often as it occurs), as
    the answers are. Drawn from word types instead, they were mostly rare words, and the rule "pick the most
    frequent word", which ignores the passage, scored 0.63 on Shakespeare; drawn like this it scores 0.276
    (chance 0.25). It is not exactly chance (the answer is never a repeat of a distractor, which favours
    frequent answers; on a corpus with a few dominant words far more), so evaluate_run reports that rule
    beside the model (`frequency_baseline`)."""
    words = [m for m in re.finditer(r"(?<= )[A-Za-z]{4,}\b", text) if m.start() > context + 1]
    occurrences: dict[int, list[str]] = {}
    for m in words:
        occurrences.setdefault(len(m[0]), []).append(m[0])
    rng, items = random.Random(seed), []
    for m in words[::max(1, len(words) // n)][:n]:
        pool, answer = occurrences[len(m[0])], m[0]
        if len({w.lower() for w in pool} - {answer.lower()}) < 3:
            continue
        choices = [answer]
        while len(choices) < 4:  # distinct words (case aside), each drawn with its frequency
            w = rng.choice(pool)
            if w.lower() not in {c.lower() for c in choices}:
                choices.append(w)
        rng.shuffle(choices)
        items.append(dict(context=text[m.start() - 1 - context:m.start() - 1], choices=choices,
                          label=choices.index(answer)))
    return items


def cloze_context(seq_len: int, bytes_per_token: float) -> int:
    """Passage characters that fit the model's context with room for the answer (about 12 tokens)."""
    return max(16, min(CLOZE_CONTEXT, int((seq_len - 12) * bytes_per_token)))


def frequency_baseline(text: str, items: list[dict]) -> float:
    """Accuracy of the context-free rule "pick the choice that occurs most often in `text`": what a
    cloze score must beat before it says anything about the passage."""
    from collections import Counter
    counts = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    pick = lambda it: max(range(len(it["choices"])), key=lambda i: counts[it["choices"][i].lower()])
    return sum(pick(it) == it["label"] for it in items) / len(items)


def write_tasks(text: str, folder: Path, context: int = CLOZE_CONTEXT) -> list[dict]:
    """The two offline tasks as harness YAML + JSON lines in `folder` (the harness's include_path); returns
    the cloze items."""
    items = cloze_items(text, context=context)
    for name, rows in (("corpus_ppl", ppl_docs(text)), ("corpus_cloze", items)):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        head = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
                "test_split: test\n")
        metric = "  - metric: {}\n    aggregation: {}\n    higher_is_better: {}\n".format
        body = ('output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
                + metric("bits_per_byte", "bits_per_byte", "false") + metric("byte_perplexity", "weighted_perplexity", "false")
                + metric("word_perplexity", "weighted_perplexity", "false")
                if name == "corpus_ppl" else
                'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
                'doc_to_target: "{{label}}"\nmetric_list:\n' + metric("acc", "mean", "true"))
        body += "num_fewshot: 0\n"
        (folder / f"{name}.yaml").write_text(head + body + "metadata:\n  version: 1.0\n")
    return items


def evaluate_run(run_dir: str | Path, tasks: tuple[str, ...] = LOCAL_TASKS, limit: int | None = None,
                 batch_size: int = 16, device: str = "cpu", progress: bool = False) -> dict:
    """Export `run_dir` to run_dir/hf, score it on `tasks`, store the scores in record.json; returns
    {"tasks": {task: {metric: value}}, "table": text, ...}. progress=False hides the harness's progress
    bars and notices (one bar per document of a rolling task)."""
    run_dir = Path(run_dir)
    if limit is not None and limit < 1:
        raise EvaluateError(f"--limit {limit} scores no document; give at least 1, or leave it out to score every document")
    if not tasks or any(not t.strip() for t in tasks):
        raise EvaluateError(f"--tasks {','.join(tasks)!r} names no task or an empty one; give comma-separated harness tasks, "
                            f"e.g. --tasks {','.join(LOCAL_TASKS)} (the default)")
    if batch_size < 1:
        raise EvaluateError(f"--batch-size {batch_size} scores nothing per batch; give at least 1 (default 16)")
    check_device(device)
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise EvaluateError(f"lm-evaluation-harness is missing: {install_hint('hf')}") from None
    from .core.run_dir import lock_run, unlock_run
    if not (run_dir / "record.json").is_file():
        raise EvaluateError(f"{run_dir} has no record.json: evaluate a finished run (python -m accellib.train "
                            f"--resume {run_dir} finishes it)")
    if err := lock_run(run_dir):  # a training or another evaluation writing the same record.json
        raise EvaluateError(err)
    try:
        from .core.config import load_config
        from .models.hf_gpt2 import check_exportable
        cfg = load_config(run_dir / "config.yaml")
        check_exportable(cfg.model)
        with tempfile.TemporaryDirectory(prefix="accellib_lm_eval_") as tmp, _quiet(not progress):
            local = [t for t in tasks if t in LOCAL_TASKS]
            if local:
                from .data.tokens import load_token_data
                bpt = float(load_token_data(cfg.data.path, verify=False).meta.get("bytes_per_token") or 1.0)
                text = validation_text(cfg.data.path)
                items = write_tasks(text, Path(tmp), cloze_context(cfg.model.seq_len, bpt))
            manager = TaskManager(include_path=tmp if local else None)
            unknown = [t for t in tasks if t not in manager.all_tasks]
            if unknown:
                raise EvaluateError(f"unknown lm-eval task(s) {', '.join(unknown)}; the offline ones are "
                                    f"{', '.join(LOCAL_TASKS)} (python -m lm_eval ls tasks lists the rest)")
            info = export_run(run_dir, run_dir / "hf")
            if info["tokenizer"] is None:
                raise EvaluateError(f"no tokenizer for {run_dir}: its data folder {cfg.data.path} cannot be read "
                                    "from here (run from the folder the run was trained in)")
            lm = HFLM(pretrained=str(run_dir / "hf"), device=device, batch_size=batch_size, dtype="float32",
                      max_length=cfg.model.seq_len, prefix_token_id=_prefix_id(run_dir / "hf", info["tokenizer"]))
            try:
                with _quiet_git(lm_eval):
                    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                                  bootstrap_iters=100, log_samples=False,
                                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0)
            except (ConnectionError, OSError) as e:
                raise EvaluateError(f"lm-eval could not load a task's data ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0][:120]}); tasks other than {', '.join(LOCAL_TASKS)} "
                                    "download their data set and need the network") from None
        scores = {t: {k.split(",")[0]: v for k, v in r.items()
                      if k not in ("alias", "sample_len") and isinstance(v, (int, float))}
                  for t, r in res["results"].items()}
        if "corpus_cloze" in scores:  # what the model's accuracy must beat to say anything about the passage
            scores["corpus_cloze"]["acc_frequency_rule"] = frequency_baseline(text, items[:limit or len(items)])
        out = dict(tasks=scores, limit=limit, step=info["step"], n_docs={t: res["n-samples"][t]["effective"]
                                                                       for t in res["n-samples"]},
                   lm_eval=lm_eval.__version__ if hasattr(lm_eval, "__version__") else None)
        _store(run_dir, out)
        return dict(out, table=table(scores))
    finally:
        unlock_run(run_dir)


@contextlib.contextmanager
def _quiet(on: bool):
    """Hide the harness's and transformers' progress bars and notices (stderr and their loggers)."""
    if not on:
        yield
        return
    import io
    import logging
    loggers = [logging.getLogger(n) for n in ("lm-eval", "lm_eval", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    from datasets.utils import logging as ds_logging  # its "Generating test split" bars (widgets in Jupyter)
    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        if bars:
            ds_logging.enable_progress_bar()


def table(scores: dict) -> str:
    """task | metric | value | stderr, one line per metric."""
    lines = [f"{'task':<14}{'metric':<20}{'value':>12}{'stderr':>10}"]
    for t, ms in scores.items():
        for k, v in ms.items():
            if not k.endswith("_stderr"):
                se = ms.get(f"{k}_stderr")
                lines.append(f"{t:<14}{k:<20}{v:>12.4f}{(f'{se:.4f}' if isinstance(se, float) else '-'):>10}")
    return "\n".join(lines)


def evaluate_arms(out: Path, labels: list[str], tasks: tuple[str, ...] = LOCAL_TASKS,
                  limit: int | None = None) -> tuple[dict, str]:
    """`compare --lm-eval`: evaluate every run of a comparison (out/<arm>[/seed<k>]); returns
    ({arm: {"task metric": [value per seed]}}, a table of means ± sd over seeds)."""
    from .analysis.stats import mean_sd
    per_arm: dict[str, dict[str, list[float]]] = {}
    notes = []
    for lb in labels:
        try:
            scores = evaluate_run(out / lb, tasks, limit)["tasks"]
        except (EvaluateError, ExportError, ConfigError) as e:
            notes.append(f"{lb}: not evaluated ({e})")
            continue
        for t, ms in scores.items():
            for k, v in ms.items():
                if k.endswith("_stderr") or (k.endswith("perplexity") and "bits_per_byte" in ms):
                    continue  # bits per byte says what the perplexities say
                per_arm.setdefault(lb.split("/")[0], {}).setdefault(f"{t} {k}", []).append(v)
    cols = sorted({c for d in per_arm.values() for c in d})
    w = max([16, *(len(c) + 2 for c in cols)])
    lines = [f"{'arm':<16}" + "".join(f"{c:>{w}}" for c in cols)]
    for arm, d in per_arm.items():
        cell = lambda v: f"{mean_sd(v)[0]:.4f}" + (f" ± {mean_sd(v)[1]:.4f}" if len(v) > 1 else "")
        lines.append(f"{arm:<16}" + "".join(f"{cell(d[c]) if c in d else '-':>{w}}" for c in cols))
    return per_arm, "\n".join(lines + notes)


def _prefix_id(hf_dir: Path, kind: str) -> int:
    """The token a rolling log-likelihood starts after: GPT-2's <|endoftext|>, else the newline."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf_dir)
    return tok.eos_token_id if kind == "gpt2" else tok("\n", add_special_tokens=False).input_ids[-1]


def _store(run_dir: Path, out: dict) -> None:
    from .core.records import read_record, write_json
    rec = read_record(run_dir)
    rec.setdefault("lm_eval", {}).update(out["tasks"])
    rec["lm_eval_info"] = {k: v for k, v in out.items() if k != "tasks"}
    write_json(run_dir / "record.json", rec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("evaluate"), description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a finished run folder (accellib.train or one compare arm)")
    ap.add_argument("--tasks", default=",".join(LOCAL_TASKS),
                    help=f"comma-separated harness tasks (default: the offline {', '.join(LOCAL_TASKS)})")
    ap.add_argument("--limit", type=int, default=None, help="score only the first N documents of each task")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--progress", action="store_true", help="show the harness's progress bars and notices")
    a = ap.parse_args(argv)
    quiet_transformers()
    try:
        out = evaluate_run(a.run_dir, tuple(a.tasks.split(",")) if a.tasks.strip() else (), a.limit, a.batch_size,
                           a.device, a.progress)
    except (EvaluateError, ExportError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out["table"])
    print(f"stored in {Path(a.run_dir) / 'record.json'} under \"lm_eval\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
