"""The ZeRO half of layered accumulation (layered_accumulation.shard=true) on 2 gloo processes: gradients
and updated weights bitwise those of the standard data-parallel trainer and of unsharded layered
accumulation, the gradient clip off or active (the shards' norm is computed as the trainer's); the traffic
per step equals its closed form; a sharded run resumes exactly."""
from pathlib import Path

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.core.launch import launch_processes
from accellib.parallel.zero_layered import closed_form_volume, layer_params
from accellib.core.records import TIMING_FIELDS, read_metrics
from accellib.core.trainer import Trainer
from conftest import tiny_overrides

M = 3   # micro-batches per step
ARMS = {"plain": {}, "lga": {"layered_accumulation.enabled": True},
        "zero": {"layered_accumulation.enabled": True, "layered_accumulation.shard": True},
        "zero_standard": {"layered_accumulation.enabled": True, "layered_accumulation.shard": True,
                          "layered_accumulation.order": "standard"},
        "zero_link": {"layered_accumulation.enabled": True, "layered_accumulation.shard": True,   # the emulated
                      "layered_accumulation.emulate_mbps": 500.0}}                               # link's thread
CLIP = {"optim.grad_clip": 0.05}   # below every step's norm: the clip scales every gradient
ARMS.update({"plain_clip": CLIP, "lga_clip": {**ARMS["lga"], **CLIP}, "zero_clip": {**ARMS["zero"], **CLIP}})


def _overrides(data_dir, tie: bool, **kw):
    # every dimension even (vocab 258), so no shard is padded and the counts are the closed form's exactly
    return tiny_overrides(data_dir, **{"optim.grad_clip": 0, "train.grad_accum": M, "train.batch_size": 2,
                                       "model.vocab_size": 258, "model.tie_head": tie, **kw})


RESUME = {"layered_accumulation.enabled": True, "layered_accumulation.shard": True, "train.grad_accum": 2,
          "train.batch_size": 4, "train.steps": 5, "train.checkpoint_every": 2, "train.eval_every": 2}


def _arms(data_dir, tie):
    """Each arm trains 2 steps (4 with the clip); its last step's gradients, the weights after it, the
    pre-clip norms and the sharded traffic."""
    out = {}
    for arm, kw in ARMS.items():
        tr = Trainer(load_config(None, _overrides(data_dir, tie, **kw)))
        names = {id(p): n for n, p in tr.raw_model.named_parameters()}
        grads, step = {}, tr.optimizer.step

        def capture(*a, **k):   # the gradients the optimizer sees (the shards' on a sharded run)
            if tr.engine is None:
                grads.update({n: p.grad.clone() for n, p in tr.raw_model.named_parameters()})
            else:
                sh = tr.engine.sharded
                grads.update({names[id(p)]: s.grad.clone() for p, s in zip(sh.params, sh.shards)})
            return step(*a, **k)
        tr.optimizer.step = capture
        norms = []
        # the second step's gradients depend on the first update; the clip arms take 4 steps (the norm
        # summed in another order differed from the third step on, before the norm was one computation)
        for _ in range(4 if arm.endswith("_clip") else 2):
            tr.train_step()
            norms.append(tr.last_grad_norm.clone())
        rec = dict(grads=grads, norms=norms)
        if tr.engine is not None:
            sh = tr.engine.sharded
            rec.update(volume=dict(sh.volume), gathers={names[id(p)]: sh.gathers[id(p)] for p in sh.params},
                       # full weights alive between steps, bytes (all released: only the shards remain)
                       alive=sum(p.untyped_storage().nbytes() for p in tr.raw_model.parameters()),
                       shard_bytes=sum(s.numel() * s.element_size() for s in sh.shards))
            tr.engine.sync_replica()
        rec["weights"] = {n: p.detach().clone() for n, p in tr.raw_model.named_parameters()}
        out[arm] = rec
    return out, tr


def _worker(data_dir, out_dir):
    """One launch of 2 processes for every test here (each launch costs seconds of start-up)."""
    from accelerate.state import AcceleratorState
    from accellib.train import training_function
    out = {}
    for tie in (False, True):
        out[tie], tr = _arms(data_dir, tie)
    rank = tr.accelerator.process_index
    torch.save(out, Path(out_dir, f"rank{rank}.pt"))
    # checkpoint and resume: uninterrupted; crashed after step 3 (on both processes); resumed
    cfg = lambda: load_config(None, tiny_overrides(data_dir, **RESUME))   # noqa: E731
    training_function(cfg(), Path(out_dir, "full"))
    orig = Trainer.train_step

    def crash(self):
        if self.state.step == 3:
            raise RuntimeError("crash")
        return orig(self)
    Trainer.train_step = crash
    try:
        training_function(cfg(), Path(out_dir, "part"))
        raise AssertionError("the run did not crash")
    except RuntimeError as e:
        assert str(e) == "crash"   # after 3 steps; the checkpoint at 2: the resume replays step 3
    Trainer.train_step = orig
    training_function(cfg(), Path(out_dir, "part"), resume=True)
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="module")
def runs(tiny_data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("zero")
    launch_processes(_worker, (tiny_data_dir, d), 2, timeout_s=240, start_method="spawn")
    return d


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tie", [False, True])
def test_sharded_gradients_weights_and_traffic(tiny_data_dir, runs, tie):
    r = [torch.load(runs / f"rank{k}.pt")[tie] for k in (0, 1)]
    plain = r[0]["plain"]
    assert len(plain["grads"]) > 10
    for k in (0, 1):
        for arm in ("lga", "zero", "zero_standard", "zero_link"):
            assert r[k][arm]["weights"].keys() == plain["weights"].keys()
            for n, w in plain["weights"].items():   # the full replica after two AdamW steps
                assert torch.equal(r[k][arm]["weights"][n], w), (arm, n)
        for n, g in plain["grads"].items():
            assert torch.equal(r[k]["lga"]["grads"][n], g), n
    for arm in ("zero", "zero_standard", "zero_link"):
        for n, g in plain["grads"].items():   # rank k holds rows [k rows/2, (k+1) rows/2) of each gradient
            assert torch.equal(torch.cat([r[0][arm]["grads"][n], r[1][arm]["grads"][n]]), g), (arm, n)
    # the clip active: the sharded norm is the unsharded one to the bit, so the clipped updates are too
    clipped = r[0]["plain_clip"]
    assert all(n > CLIP["optim.grad_clip"] for n in clipped["norms"])
    assert not torch.equal(clipped["weights"]["transformer.wte.weight"], plain["weights"]["transformer.wte.weight"])
    for k in (0, 1):
        for arm in ("lga_clip", "zero_clip"):
            assert all(torch.equal(a, b) for a, b in zip(r[k][arm]["norms"], clipped["norms"])), arm
            for n, w in clipped["weights"].items():
                assert torch.equal(r[k][arm]["weights"][n], w), (arm, n)
        for n, g in clipped["grads"].items():
            assert torch.equal(r[k]["lga_clip"]["grads"][n], g), n
    for n, g in clipped["grads"].items():
        assert torch.equal(torch.cat([r[0]["zero_clip"]["grads"][n], r[1]["zero_clip"]["grads"][n]]), g), n
    # traffic per step against the closed form, from the plain model's shapes
    layers, n_params = layer_params(Trainer(load_config(None, _overrides(tiny_data_dir, tie))).raw_model)
    assert (sum(layers) > n_params) == tie
    for arm, layered in (("zero", True), ("zero_standard", False), ("zero_link", True)):
        want = closed_form_volume(layers, n_params, 2, M, layered, beta=4)
        for k in (0, 1):
            assert r[k][arm]["volume"] == want, (arm, r[k][arm]["volume"], want)
            assert r[k][arm]["alive"] == 0 and r[k][arm]["shard_bytes"] * 2 == 4 * n_params
            per = 2 if layered else 2 * M
            tied = "transformer.wte.weight"
            assert all(c == (2 * per if tie and n == tied else per) for n, c in r[k][arm]["gathers"].items())
    # layered: 2 gathers per layer instead of 2 m
    assert r[0]["zero_standard"]["volume"]["all_gather"] == M * r[0]["zero"]["volume"]["all_gather"]


def test_sharded_run_resumes_exactly(runs):
    timing = TIMING_FIELDS
    strip = lambda rs: [{k: v for k, v in r.items() if k not in timing} for r in rs]   # noqa: E731
    full, part = strip(read_metrics(runs / "full")), strip(read_metrics(runs / "part"))
    assert len(full) == 5 and full == part
    assert "val_loss" in full[-1] and full[-1]["all_gather_mb"] > 0
    assert (runs / "part" / "checkpoints" / "last" / "engine_rank1.pt").is_file()


def test_sharding_needs_several_processes(tiny_data_dir):
    with pytest.raises(ConfigError, match="shard=true shards the weights") as e:
        Trainer(load_config(None, tiny_overrides(tiny_data_dir, **ARMS["zero"])))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("stored,now", [(True, False), (False, True)])
def test_resume_refuses_to_switch_sharding(tiny_data_dir, tmp_path, stored, now):
    """The checkpoint's optimizer state is the shards' (or the full model's): a resume that flips
    layered_accumulation.shard is refused before loading anything, in one line naming the setting."""
    import yaml
    from accellib.train import resume_config
    over = tiny_overrides(tiny_data_dir, **{**ARMS["zero"], "layered_accumulation.shard": stored})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(load_config(None, over).to_dict(), sort_keys=False))
    with pytest.raises(ConfigError, match=f"--layered_accumulation.shard={str(now).lower()} changes how the run .* "
                                          f"trained with layered_accumulation.shard={str(stored).lower()}") as e:
        resume_config(tmp_path, [f"--layered_accumulation.shard={now}"])
    assert "\n" not in str(e.value)
    resume_config(tmp_path, [f"--layered_accumulation.shard={stored}", "--layered_accumulation.emulate_mbps=5"])
