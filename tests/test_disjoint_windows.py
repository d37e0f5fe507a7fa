"""data.windows=disjoint: a seeded order of non-overlapping windows, none read twice within an epoch."""
import numpy as np
import pytest
import torch

from accellib.core.config import load_config
from accellib.core.options import ConfigError
from accellib.core.tasks import make_task
from accellib.data.tokens import disjoint_batch, disjoint_windows


def test_one_epoch_reads_every_window_once_and_predicts_every_token_once():
    T, n = 8, 8 * 50 + 1 + 3            # 50 windows and 3 left-over tokens
    tokens = np.arange(n, dtype=np.uint16)
    assert disjoint_windows(n, T) == 50
    xs, ys = zip(*(disjoint_batch(tokens, 5, T, seed=7, first=5 * k) for k in range(10)))
    x, y = torch.cat(xs), torch.cat(ys)
    assert torch.equal(y, x + 1)                                   # next-token targets
    starts = sorted(x[:, 0].tolist())
    assert starts == [8 * s for s in range(50)]                    # every window once, none twice
    assert sorted(y.flatten().tolist()) == list(range(1, 401))     # every target token once
    assert x[:, 0].tolist() != starts                              # shuffled, not in corpus order


def test_order_depends_on_seed_and_epoch_only():
    tokens = np.arange(8 * 20 + 1, dtype=np.uint16)
    a = disjoint_batch(tokens, 20, 8, seed=1, first=0)[0]
    assert torch.equal(a, torch.cat([disjoint_batch(tokens, 4, 8, seed=1, first=4 * k)[0] for k in range(5)]))
    assert not torch.equal(a, disjoint_batch(tokens, 20, 8, seed=2, first=0)[0])
    second = disjoint_batch(tokens, 20, 8, seed=1, first=20)[0]     # epoch 2: all windows again, a new order
    assert sorted(second[:, 0].tolist()) == sorted(a[:, 0].tolist()) and not torch.equal(second, a)


def _task(*over):
    cfg = load_config("configs/tiny.yaml", ["--data.windows=disjoint", "--train.batch_size=4", *over])
    t = make_task(cfg)
    t.configure()
    return t


def test_micro_batching_and_ranks_read_the_same_windows():
    t = _task()
    # one micro-batch of 4 per step vs. 2 micro-batches (or 2 ranks x 1) of 4: the k-th window is the same
    one = torch.cat([t.batch(s, 0, 1)[0] for s in range(4)])
    two = torch.cat([t.batch(s, i, 2)[0] for s in range(2) for i in range(2)])
    assert torch.equal(one, two)
    seen = [tuple(r) for r in torch.cat([t.batch(s, 0, 1)[0] for s in range(50)]).tolist()]
    assert len(set(seen)) == len(seen) == 200                      # 200 windows of text, none repeated
    t_random = _task("--data.windows=random")
    assert not torch.equal(t_random.batch(0, 0, 1)[0], t.batch(0, 0, 1)[0])


def test_disjoint_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="data.windows=disjoint is for model.kind=gpt"):
        _task("--model.kind=mlm")
