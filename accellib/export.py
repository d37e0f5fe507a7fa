"""To and from HuggingFace transformers: an accellib GPT is a GPT-2, up to two layout details.

    python -m accellib.export RUN_DIR --out DIR       # a GPT2LMHeadModel folder (+ tokenizer) from any run
        [--data DATA_DIR]                             # the run's token folder, if data.path has moved
    --model.init_from=hf:PATH_OR_NAME                 # start training from a GPT-2 checkpoint (LMTask.configure)

What maps one-to-one (parameter names follow GPT-2, see accellib/models/transformer.py):
  * GPT-2's `Conv1D` stores a Linear's weight transposed, (in, out): every c_attn / c_proj / c_fc
    weight is transposed on the way, nothing else is.
  * The MLP's GELU: accellib's exact GELU is transformers' `activation_function="gelu"`; GPT-2's own
    "gelu_new" (tanh approximation) is accellib's `model.act=gelu_tanh`.
  * GPT-2 always has biases: a `model.bias=false` model is exported with zero biases (the same function).
  * Untied heads are exported with `tie_word_embeddings=false`.
  * The vocabulary is the tokenizer's: a model trained on GPT-2 tokenizer data has 50,304 rows, padded
    for speed (accellib.core.tasks.model_vocab_size); the export keeps the tokenizer's 50,257 rows of wte
    (and of an untied lm_head), so the GPT-2 model can never produce a padding id. Importing pads back:
    a GPT-2 checkpoint's rows are copied, the padding rows keep their fresh initialisation.

What is refused, in one line (`ExportError`), rather than exported to a model that computes something
else: masked-LM runs (`kind=mlm`: bidirectional attention, no GPT-2 equivalent), image models, and
transformers without LayerNorm (`norm=none`, the standardization-loss variant); and a checkpoint that does not
fit the run's config.yaml (edited after training, or another run's checkpoint copied in): the line names the model
fields and parameter shapes that differ (accellib.core.checkpoint_shapes).

What a GPT-2 folder cannot carry is said, one line each, on the command's output and in the provenance
file (accellib_export.json: run, step, data folder, tokenizer, `lowp_dropped`, `notes`): a low-precision
run (`lowp`) exports its weights to an fp32 model, the emulated (or FP8) numerics dropped; a run whose
corpus moved (data.path gone) exports without a tokenizer unless `--data DIR` names the folder.

The exported folder is written next to its destination and swapped in whole, after its logits were
checked against accellib's on validation windows: a failed or killed export leaves DIR as it was.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from . import prog
from .core.options import ConfigError
from .core.config import load_config
from .models.hf_gpt2 import (ExportError, _transformers, check_exportable, gpt2_config, quiet_transformers,
                             to_gpt2_state)
from .models.transformer import ModelConfig, Transformer
from .data import atomic_folder
from .core.run_dir import EXPORT_FILES, checkpoint_folder, checkpoint_layout, checkpoint_state
from .core.checkpoint_shapes import mismatch_line, read_model_state as model_state_dict  # (its old name, here)

FILES = EXPORT_FILES  # what an export folder holds (run_dir knows them: an --overwrite of the run keeps anything else)
MAX_LOGIT_DIFF = 1e-4  # an export whose logits differ more from accellib's is not written


# ----------------------------------------------------------------------------- accellib -> GPT-2


def run_weights(run_dir: Path) -> tuple[object, dict, int]:
    """(run config, the model's state dict, its step) of a run folder: the last checkpoint, or a finished
    V-cycle's final (level-0) model. A checkpoint that does not fit config.yaml's model is refused in one line
    naming what differs (accellib.core.checkpoint_shapes)."""
    if not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir} has no config.yaml; give a run folder written by accellib.train")
    try:
        cfg = load_config(run_dir / "config.yaml")
    except ConfigError as e:
        raise ExportError(f"{run_dir}/config.yaml: {e}") from None
    check_exportable(cfg.model)
    if (run_dir / "vcycle.json").is_file():
        prog = json.loads((run_dir / "vcycle.json").read_text())
        last = str(len(prog["stages"]) - 1)
        if last not in prog.get("done", {}):
            raise ExportError(f"the V-cycle in {run_dir} has not finished (stage {last} is not done); finish it "
                              f"with python -m accellib.train --resume {run_dir}")
        f, step = run_dir / f"stage_{last}" / "final_model.pt", prog["done"][last]["step"]
    else:
        src = checkpoint_folder(run_dir)
        found = checkpoint_layout(src) if src else None
        if found is None:
            raise ExportError(f"{run_dir} has no checkpoint (checkpoints/last); train it first")
        f, step = found[1], None
    try:
        sd = model_state_dict(f)
    except Exception as e:
        raise ExportError(f"{f} cannot be read ({type(e).__name__}); restore it or train the run again") from None
    if step is None:
        step = checkpoint_state(f.parent).get("step")
    with torch.device("meta"):  # the config's shapes, nothing allocated
        why = mismatch_line(sd, Transformer(cfg.model), cfg.model)
    if why is not None:  # before: torch's size-mismatch traceback, one line per parameter
        raise ExportError(f"{f} does not fit {run_dir / 'config.yaml'}: {why}; put back the config.yaml the "
                          "checkpoint was trained with, or use the run it came from")
    return cfg, {k: v.float() for k, v in sd.items()}, step


def lowp_note(cfg) -> tuple[dict | None, str | None]:
    """(the run's lowp section, a one-line note) when it trained under low-precision numerics, which a
    GPT-2 checkpoint cannot carry; (None, None) otherwise."""
    import dataclasses
    lp = cfg.techniques.get("lowp")
    if lp is None or not lp.enabled:
        return None, None
    if lp.backend == "torchao":
        how = "real FP8 GEMMs (torchao.float8, fp32 master weights)"
    else:
        how = (f"{lp.operand} operands and {lp.acc} accumulation (chunk {lp.chunk}), "
               f"{lp.weights} weights, first/last Linear {'kept fp32' if lp.keep_first_last else 'emulated too'}")
    return dataclasses.asdict(lp), (
        f"the lowp emulation is dropped: the run computed with {how}; the export is an fp32 GPT-2 with the "
        f"same weights, so its losses are not the run's val_loss (score the export itself, e.g. python -m "
        f"accellib.evaluate RUN)")


def export_run(run_dir: str | Path, out: str | Path, data: str | Path | None = None) -> dict:
    """Write `run_dir`'s model as a transformers GPT2LMHeadModel folder at `out`; returns the provenance
    (also written as out/accellib_export.json), with the largest logit difference measured. `data`: the
    run's token folder, when its config's data.path has moved (the tokenizer comes from there).
    `notes` in the provenance: one line each for what the export could not carry (the lowp numerics, a
    tokenizer whose folder is gone)."""
    run_dir, out = Path(run_dir), Path(out)
    _transformers()  # a one-line error before anything else needs it
    try:  # where the export goes can be written (before the model is read)
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"--out {out} cannot be created ({e.strerror or type(e).__name__}); give a folder you "
                          "can write to") from None
    cfg, sd, step = run_weights(run_dir)
    if data is not None and not Path(data).is_dir():
        raise ExportError(f"--data {data} does not exist; give the folder the run's corpus ({cfg.data.path}) "
                          "moved to")
    model = Transformer(cfg.model)
    model.load_state_dict(sd, strict=True)
    model.eval()
    from .data.tokenizer_export import hf_tokenizer
    lowp, note = lowp_note(cfg)
    notes = [note] if note else []
    data_path = Path(data) if data is not None else Path(cfg.data.path)
    tok, tok_kind, why = hf_tokenizer(data_path, cfg.model)
    if tok is not None and len(tok) > cfg.model.vocab_size:
        raise ExportError(f"{data_path} has a {tok_kind} tokenizer of {len(tok)} ids but the model has "
                          f"{cfg.model.vocab_size}: it is not the run's corpus; give the folder it trained on with --data")
    if why is not None:
        fix = ("pass the folder it moved to with --data DIR, or restore it there, and export again" if data is None
               else "give the run's token folder with --data DIR")
        src = f"the run's data.path, {run_dir / 'config.yaml'}" if data is None else "--data"
        notes.append(f"no tokenizer exported: {why} ({src}); {fix}")
    eos = tok.eos_token_id if tok is not None else None
    # the tokenizer's ids, without the model's padding rows; no tokenizer: every row (none is known to be padding)
    n_ids = min(len(tok), cfg.model.vocab_size) if tok is not None else cfg.model.vocab_size
    hf_cfg = gpt2_config(cfg.model, eos, n_ids)
    try:
        with atomic_folder.staged_folder(out, FILES) as stage:  # swapped in whole only if the block ends normally
            info = dict(run=str(run_dir), step=step, data=str(data_path), tokenizer=tok_kind, vocab_size=n_ids,
                        padding_rows_dropped=cfg.model.vocab_size - n_ids, lowp_dropped=lowp, notes=notes,
                        **_write_export(stage, model, sd, cfg.model, hf_cfg, tok))
            (stage / "accellib_export.json").write_text(json.dumps(info, indent=1) + "\n")
    except FileExistsError as e:  # `out` holds files that are not an export
        raise ExportError(str(e)) from None
    except OSError as e:  # no permission, a file where a folder should be, a full disk
        raise ExportError(f"--out {out} cannot be written ({e.strerror or type(e).__name__}); give a folder you "
                          "can write to") from None
    return info


def _write_export(stage: Path, model: Transformer, sd: dict, m: ModelConfig, hf_cfg, tok) -> dict:
    """Fill the staging folder: the transformers model, the tokenizer, and the provenance, after checking
    the written model's logits against accellib's."""
    transformers = _transformers()
    hf = transformers.GPT2LMHeadModel(hf_cfg)
    missing, unexpected = hf.load_state_dict(to_gpt2_state(sd, m, hf_cfg.vocab_size), strict=False)
    unexpected = [k for k in unexpected if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if unexpected or [k for k in missing if not (m.tie_head and k == "lm_head.weight")]:
        raise ExportError(f"GPT-2 and accellib disagree on parameters: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")
    hf.save_pretrained(stage, safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(stage)
    diff = max_logit_diff(model, stage, m, vocab_size=hf_cfg.vocab_size)
    if diff > MAX_LOGIT_DIFF:
        raise ExportError(f"the exported model's logits differ from accellib's by {diff:.2e} "
                          f"(> {MAX_LOGIT_DIFF}); nothing was written")
    return dict(max_logit_diff=diff, params=sum(p.numel() for p in model.parameters()), tie_head=m.tie_head,
                act=m.act, transformers=transformers.__version__)


@torch.no_grad()
def max_logit_diff(model: Transformer, hf_dir: Path, m: ModelConfig, n: int = 4,
                   vocab_size: int | None = None) -> float:
    """Largest |logit| difference between `model` and the transformers model saved in `hf_dir`, on n
    pseudo-random windows of full length of ids below `vocab_size` (the exported ids; m's when None),
    over the exported columns: a padded model's extra columns have no counterpart."""
    hf = _transformers().GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    v = vocab_size or m.vocab_size
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(v, (n, m.seq_len), generator=g)
    return (hf(idx).logits - model(idx)[0][..., :v]).abs().max().item()


# ----------------------------------------------------------------------------- GPT-2 -> accellib


# ----------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("export"), description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run folder written by accellib.train (or a compare arm's folder)")
    ap.add_argument("--out", required=True, help="the transformers folder to write (replaced whole if it is an export)")
    ap.add_argument("--data", help="the run's token folder, when its config's data.path has moved (the "
                    "tokenizer is read from it)")
    a = ap.parse_args(argv)
    quiet_transformers()
    try:
        info = export_run(a.run_dir, a.out, a.data)
    except (ExportError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lowp = [n for n in info["notes"] if n.startswith("the lowp")]   # said on the line itself
    print(f"{a.run_dir} (step {info['step']}, {info['params']:,} parameters, {info['tokenizer'] or 'no'} tokenizer) "
          f"-> {a.out}: GPT2LMHeadModel; largest logit difference from accellib {info['max_logit_diff']:.1e}"
          + "".join(f"; {n}" for n in lowp))
    for n in info["notes"]:
        if n not in lowp:
            print(f"note: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
