"""A run's regime, counted one way: tokens per parameter (all parameters) and epochs of the corpus.

Every comparison in accellib says where it stands on the one axis that decides what a training technique can
show: how long the model is trained for its size. Hoffmann et al. (2022, "Training Compute-Optimal Large
Language Models", section 3 and Table 3) count *all* parameters N and training tokens D, and find D/N ~ 20
compute-optimal at their scale; the papers whose techniques accellib teaches trained far past that (random-LTD's
GPT-3 1.3B read 300B tokens, ~230 per parameter). Below ~20 a model is under-trained for its size (a smaller
model that reads more tokens does better at the same FLOPs); above it, the size is a choice made for serving and
the fair control of a technique is the same-size model. The count here is the one the README, the notebooks and
the findings table use: `num_params` of the model (embeddings, position embeddings and head included).
"""
from __future__ import annotations

CHINCHILLA_TOKENS_PER_PARAM = 20.0   # Hoffmann et al. 2022: compute-optimal D/N at their scale


def params_of(cfg) -> int:
    """All parameters of the model `cfg` builds (the data must have set its vocabulary; see
    drivers.arms.check_data). Built on the meta device: nothing is allocated."""
    import torch

    from ..core.tasks import make_task
    from ..models.transformer import num_params
    with torch.device("meta"):
        return num_params(make_task(cfg).build_model())


def tokens_per_param(tokens: float, params: float) -> float:
    if params <= 0:
        raise ValueError(f"tokens per parameter needs a positive parameter count, got {params}")
    return tokens / params


def regime(tokens: float, params: float, train_tokens: float) -> dict:
    """{params, tokens, tokens_per_param, epochs, vs_compute_optimal}: the last is D/N over Hoffmann's 20."""
    tpp = tokens_per_param(tokens, params)
    return dict(params=int(params), tokens=int(tokens), tokens_per_param=tpp, epochs=tokens / train_tokens,
                vs_compute_optimal=tpp / CHINCHILLA_TOKENS_PER_PARAM)
