"""How many graphs train.compile=blocks compiles per technique, and when (issue 42): a fixed, small number, all of
them in the first steps, so none is compiled inside the steps a benchmark times.

Counted on a CPU with the aot_eager backend: Dynamo's capture and guards (what decides a new graph) are the ones
inductor gets, and AOTAutograd traces the backward as inductor's would, without compiling C++. The compiled head
and loss (accellib.models.transformer.compiled_head_loss) are one of the graphs counted."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from accellib.core.trainer import Trainer

COMPILED = {"train.steps": 40, "train.compile": "blocks", "train.compile_backend": "aot_eager"}
WARM_UP, TIMED = 10, 30
# SBLD profiles at the end of step 4 and again every 8 steps (12, 20, 28, 36: inside the timed steps): a profile
# compiles nothing; its first dropping step (5) runs scaled blocks (Allow list) and plain ones (Block list)
SBLD = {"sbld.enabled": True, "sbld.profile_batches": 2, "sbld.profile_step": 4, "sbld.reprofile_every": 8}
PLD = {"pld.enabled": True, "pld.gamma": 0.1}  # scaled and skipped blocks from the first steps


def graphs_after(tr: Trainer, steps: int) -> int:
    for _ in range(steps):
        tr.train_step()
    return counters["stats"]["unique_graphs"]


def compiled_trainer(tiny_cfg, **over) -> Trainer:
    torch._dynamo.reset()
    counters.clear()
    return Trainer(tiny_cfg(**COMPILED, **over))


@pytest.mark.parametrize("tech, most", [("baseline", 2), ("pld", 3), ("sbld", 3)])
def test_every_graph_is_compiled_in_the_first_steps(tiny_cfg, tech, most):
    """The blocks' plain graph and the head + loss; PLD and SBLD add the scaled block (a skipped block is no
    call). Measured before issue 42: baseline 2, PLD 3, SBLD 5 (its profile, in eval mode without gradients,
    compiled a block and a head + loss graph of its own)."""
    tr = compiled_trainer(tiny_cfg, **{"pld": PLD, "sbld": SBLD}.get(tech, {}))
    warm = graphs_after(tr, WARM_UP)
    assert warm <= most, dict(counters["stats"])
    assert graphs_after(tr, TIMED) == warm, dict(counters["stats"])  # nothing new inside the timed steps
    if tech == "sbld":
        sbld = tr.techniques[0]
        assert sbld.profiled_at == [4, 12, 20, 28, 36]               # four of its profiles in the timed steps
        assert 1.0 in sbld.keep_probs(5) and min(sbld.keep_probs(5)) < 1.0


def test_the_standardization_loss_compiles_two_graphs(tiny_cfg):
    """One block graph for every block and the head + loss. Its hook appended each layer's term to a Python list
    before issue 42: Dynamo guarded on the list's length and compiled one graph per block position (5 graphs
    here; on a 12-block GPT-2 it hit the recompile limit, 8, and ran the last blocks eagerly)."""
    over = {"standardization_loss.enabled": True, "model.norm": "none"}
    tr = compiled_trainer(tiny_cfg, **over)
    eager = Trainer(tiny_cfg(**over))
    for _ in range(3):  # the terms still reach the loss
        torch.testing.assert_close(tr.train_step(), eager.train_step())
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
