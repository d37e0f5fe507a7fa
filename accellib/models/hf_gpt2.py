"""accellib's GPT <-> transformers' GPT-2: config, state dict both ways, activations, init from a checkpoint.

Conv1D weights are transposed, the vocabulary's padding rows dropped on export and kept on import; a model starts
from a GPT-2 checkpoint with `--model.init_from=hf:PATH_OR_NAME`. Writing a run's export folder is accellib/export.py."""
from __future__ import annotations

import torch

from .. import install_hint
from ..core.options import ConfigError
from .transformer import ModelConfig, Transformer


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


TO_HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}  # the second is torch's tanh GELU, as ours


FROM_HF_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


class ExportError(ValueError):
    """The run cannot become a transformers model (or a checkpoint cannot become an accellib one); one line."""


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ExportError(f"the transformers package is missing: {install_hint('hf')}") from None
    return transformers


def quiet_transformers() -> None:
    """For the command lines: no progress bars or notices from transformers (errors still show), so
    a refusal stays one line. Not done on import: a notebook's own transformers output is its business."""
    try:
        from transformers.utils import logging
    except ImportError:
        return
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def check_exportable(m: ModelConfig) -> None:
    if m.kind != "gpt":
        raise ExportError(f"model.kind={m.kind} has no GPT-2 counterpart (only causal LMs, kind=gpt, export; "
                          "a masked LM attends both ways and an image model is no LM)")
    if m.norm != "layer":
        raise ExportError(f"model.norm={m.norm}: GPT-2 always has LayerNorms, so a transformer trained without "
                          "them cannot be exported")


def gpt2_config(m: ModelConfig, eos_id: int | None = None, vocab_size: int | None = None):
    """The transformers GPT2Config that computes what Transformer(m) computes (no dropout, eval mode),
    on the first `vocab_size` ids (all of m's when None)."""
    check_exportable(m)
    return _transformers().GPT2Config(
        vocab_size=vocab_size or m.vocab_size, n_positions=m.seq_len, n_embd=m.d_model, n_layer=m.n_layer, n_head=m.n_head,
        n_inner=m.mlp_ratio * m.d_model, activation_function=TO_HF_ACT[m.act], layer_norm_epsilon=1e-5,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=m.tie_head,
        bos_token_id=eos_id, eos_token_id=eos_id, architectures=["GPT2LMHeadModel"])


def to_gpt2_state(sd: dict, m: ModelConfig, vocab_size: int | None = None) -> dict:
    """accellib state dict -> GPT2LMHeadModel state dict (Conv1D weights transposed, missing biases zero),
    the vocabulary cut to its first `vocab_size` rows (the padding dropped; all rows when None)."""
    out = {}
    for k, v in sd.items():
        out[k] = v.t().contiguous() if k.endswith(CONV1D) else v
        if vocab_size and k in ("transformer.wte.weight", "lm_head.weight"):
            out[k] = v[:vocab_size]
    if not m.bias:
        for i in range(m.n_layer):
            for name, n in (("attn.c_attn", 3 * m.d_model), ("attn.c_proj", m.d_model),
                            ("mlp.c_fc", m.mlp_ratio * m.d_model), ("mlp.c_proj", m.d_model)):
                out[f"transformer.h.{i}.{name}.bias"] = torch.zeros(n)
    if m.tie_head:
        out.pop("lm_head.weight", None)  # transformers ties it to wte itself
    return out


def hf_config(spec: str):
    """The GPT2Config of `hf:PATH_OR_NAME`; a one-line error for a missing or non-GPT-2 checkpoint."""
    try:
        c = _transformers().AutoConfig.from_pretrained(spec[3:])
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.init_from={spec}: no transformers checkpoint there ({str(e).splitlines()[0][:120]}); "
                          "give a folder with config.json (e.g. one written by python -m accellib.export) or a hub "
                          "name when online") from None
    if c.model_type != "gpt2":
        raise ConfigError(f"model.init_from={spec} is a {c.model_type} model; only GPT-2 checkpoints load "
                          "into accellib's GPT")
    return c


def model_fields(spec: str, hf_cfg) -> dict:
    """The ModelConfig fields a GPT-2 config decides; refuses what accellib's block cannot compute."""
    act = FROM_HF_ACT.get(hf_cfg.activation_function)
    inner = hf_cfg.n_inner or 4 * hf_cfg.n_embd
    problems = [
        act is None and f"activation {hf_cfg.activation_function!r} (accellib has {sorted(FROM_HF_ACT)})",
        inner % hf_cfg.n_embd and f"n_inner={inner} is not a multiple of n_embd={hf_cfg.n_embd}",
        abs(hf_cfg.layer_norm_epsilon - 1e-5) > 1e-12 and f"layer_norm_epsilon={hf_cfg.layer_norm_epsilon} (accellib: 1e-5)",
        not hf_cfg.scale_attn_weights and "unscaled attention",
        hf_cfg.scale_attn_by_inverse_layer_idx and "scale_attn_by_inverse_layer_idx",
    ]
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(f"model.init_from={spec} cannot load into accellib's GPT: {'; '.join(problems)}")
    return dict(n_layer=hf_cfg.n_layer, n_head=hf_cfg.n_head, d_model=hf_cfg.n_embd, mlp_ratio=inner // hf_cfg.n_embd,
                act=act, tie_head=bool(hf_cfg.tie_word_embeddings), bias=True, norm="layer")


def configure_from_hf(m: ModelConfig, data_vocab: int) -> None:
    """Set `m`'s architecture from its init_from checkpoint and check vocabulary and positions."""
    c = hf_config(m.init_from)
    for k, v in model_fields(m.init_from, c).items():
        setattr(m, k, v)
    if m.seq_len > c.n_positions:
        raise ConfigError(f"model.seq_len={m.seq_len} is longer than {m.init_from}'s {c.n_positions} positions; "
                          f"lower model.seq_len")
    if c.vocab_size > data_vocab:
        raise ConfigError(f"{m.init_from} has {c.vocab_size} token ids but the data has {data_vocab}: tokenize "
                          "the corpus with the checkpoint's tokenizer (e.g. data_scripts/prepare_hf.py --tokenizer gpt2)")


def from_gpt2_state(hf_sd: dict, m: ModelConfig) -> dict:
    """GPT2LMHeadModel state dict -> accellib's: Conv1D weights transposed, positions cut to seq_len,
    the vocabulary padded to the data's (extra ids, e.g. [MASK], keep their fresh initialisation)."""
    out = {}
    for k, v in hf_sd.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")) or (m.tie_head and k == "lm_head.weight"):
            continue  # causal-mask buffers of older transformers; a tied head is wte
        out[k] = v.t().contiguous() if k.endswith(CONV1D) else v
    out["transformer.wpe.weight"] = out["transformer.wpe.weight"][:m.seq_len]
    return out


@torch.no_grad()
def init_from_hf(model: Transformer, m: ModelConfig) -> None:
    """Load model.init_from's weights into `model` (built from `m` after configure_from_hf)."""
    hf_config(m.init_from)
    hf = _transformers().GPT2LMHeadModel.from_pretrained(m.init_from[3:], dtype=torch.float32)
    sd, own = from_gpt2_state(hf.state_dict(), m), model.state_dict()
    missing = set(own) - set(sd) - ({"lm_head.weight"} if m.tie_head else set())
    if missing:
        raise ConfigError(f"{m.init_from} lacks {len(missing)} of accellib's parameters, e.g. {sorted(missing)[0]}")
    for k, v in sd.items():
        o = own.get(k)
        vocab = k in ("transformer.wte.weight", "lm_head.weight")  # may have fewer rows than the data's vocab
        if o is None or (v.shape != o.shape and not (vocab and v.shape[1:] == o.shape[1:] and len(v) <= len(o))):
            raise ConfigError(f"{m.init_from}: {k} {tuple(v.shape)} does not fit accellib's GPT "
                              f"({tuple(o.shape) if o is not None else 'no such parameter'})")
        o[:len(v)].copy_(v)  # rows past GPT-2's vocabulary (e.g. the data's [MASK] id) keep their init
