"""Which parameters of a checkpoint do not fit a model, said in one line.

What `export`, `evaluate` and `--resume` say (issue 43) when a run's checkpoint comes from another config
(config.yaml edited after training, or another run's checkpoint copied in), in place of torch's `size mismatch`
traceback of one line per parameter.

    mismatch_line(sd, model, model_cfg)      # None when every key and shape fits, else the one line
    checkpoint_mismatch(folder, model, cfg)  # the same for a checkpoint folder's model file (None if unreadable)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

SHOWN = 3  # parameters named before "and N more"


def _shape(t: Any) -> str:
    return "[" + ", ".join(str(n) for n in tuple(t.shape)) + "]"


def _few(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def differences(sd: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """What differs between a checkpoint's state dict `sd` and `expected` (the model's state dict): the shapes
    that differ (checkpoint vs config, the first few, then "and N more"), the keys the checkpoint lacks and those
    the model lacks; None when they fit."""
    shapes = [k for k in expected if k in sd and tuple(sd[k].shape) != tuple(expected[k].shape)]
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    parts = []
    if shapes:
        shown = "; ".join(f"{k}: checkpoint {_shape(sd[k])}, config {_shape(expected[k])}"
                          for k in shapes[:SHOWN])
        more = f"; and {len(shapes) - SHOWN} more" if len(shapes) > SHOWN else ""
        parts.append(f"{len(shapes)} parameter shape(s) differ ({shown}{more})")
    if missing:
        parts.append(f"{len(missing)} parameter(s) of the config's model are not in the checkpoint ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} parameter(s) of the checkpoint are not in the config's model "
                     f"({_few(unexpected)})")
    return "; ".join(parts) or None


def model_fields(sd: Mapping[str, Any]) -> dict[str, Any]:
    """The model.* values a GPT-layout state dict (accellib.models.transformer's names) shows: vocab_size,
    d_model, seq_len, n_layer, mlp_ratio, bias; those it does not show are left out."""
    out: dict[str, Any] = {}
    if (wte := sd.get("transformer.wte.weight")) is not None and wte.dim() == 2:
        out.update(vocab_size=wte.shape[0], d_model=wte.shape[1])
    if (wpe := sd.get("transformer.wpe.weight")) is not None and wpe.dim() == 2:
        out["seq_len"] = wpe.shape[0]
    layers = {int(m[1]) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    if layers:
        out["n_layer"] = max(layers) + 1
    if (fc := sd.get("transformer.h.0.mlp.c_fc.weight")) is not None and out.get("d_model"):
        if fc.shape[0] % out["d_model"] == 0:
            out["mlp_ratio"] = fc.shape[0] // out["d_model"]
    if layers and "transformer.h.0.attn.c_attn.weight" in sd:
        out["bias"] = "transformer.h.0.attn.c_attn.bias" in sd
    return out


def config_hint(sd: Mapping[str, Any], model_cfg: Any) -> str | None:
    """'the checkpoint has model.d_model=32 where the config has 64' for each model field the state dict shows
    and the config sets otherwise; None when none differs (or the layout is not accellib's GPT)."""
    diff = [(k, v, getattr(model_cfg, k)) for k, v in model_fields(sd).items()
            if hasattr(model_cfg, k) and getattr(model_cfg, k) != v]
    if not diff:
        return None
    return ("the checkpoint has " + ", ".join(f"model.{k}={_yaml(v)}" for k, v, _ in diff)
            + " where the config has " + ", ".join(_yaml(c) for _, _, c in diff))


def _yaml(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def mismatch_line(sd: Mapping[str, Any], model: Any, model_cfg: Any = None) -> str | None:
    """One line (no fix: the caller knows which command to advise) saying why `sd` does not load into `model`
    (strict): the model fields that differ when `model_cfg` is given and they show, then the parameters; None when
    it fits."""
    why = differences(sd, {k.replace("_orig_mod.", ""): v for k, v in model.state_dict().items()})  # compiled
    if why is None:
        return None
    hint = config_hint(sd, model_cfg) if model_cfg is not None else None
    return f"{hint}; {why}" if hint else why


def read_model_state(f: Path) -> dict:
    """The plain model's state dict (the keys of Transformer.state_dict()) from a checkpoint's model file
    (accellib.core.run_dir.checkpoint_layout): a data-parallel launch's model.safetensors / pytorch_model.bin, an FSDP
    launch's pytorch_model_fsdp.bin (FULL_STATE_DICT), or its pytorch_model_fsdp_0/ folder of per-process shards
    (SHARDED_STATE_DICT, torch.distributed.checkpoint), merged here in one process without a process group."""
    import torch
    f = Path(f)
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(f)
    if f.is_dir():
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(f, Path(tmp) / "model.pt")
            sd = torch.load(Path(tmp) / "model.pt", map_location="cpu", weights_only=True)
        return sd["model"]  # Accelerate saves {"model": state_dict}
    return torch.load(f, map_location="cpu", weights_only=True)


def checkpoint_mismatch(folder: Path, model: Any, model_cfg: Any = None) -> str | None:
    """mismatch_line for the model file of the checkpoint folder `folder` (e.g. checkpoints/last); None when it fits,
    has no model file, or cannot be read (whoever loads it says that)."""
    from .run_dir import checkpoint_layout
    found = checkpoint_layout(Path(folder))
    if found is None:
        return None
    try:
        sd = read_model_state(found[1])
    except Exception:
        return None
    return mismatch_line(sd, model, model_cfg)
