"""Random-LTD made fit for a GPU (issue 42, item 3 and random-LTD's part of item 2), checked on a CPU:
all dropping blocks' indices in one draw (bitwise the earlier per-block draws on CPU), one dynamic graph for
the dropped blocks from their first call under train.compile=blocks, and the random_ltd.attention choice."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

import accellib.models.transformer as transformer
from accellib.core.config import load_config
from accellib.core.options import ConfigError
from accellib.core.trainer import Trainer
from accellib.data.tokens import generator_for, seed_for
from accellib.models.transformer import BlockPlan, Plan, run_block
from accellib.techniques.random_ltd import _TAG, RandomLTD, kept_subsets

LTD = {"random_ltd.enabled": True}


def params(tr):
    return torch.cat([p.detach().flatten() for p in tr.raw_model.parameters()])


# ----------------------------------------------------------------------------- one draw
def per_block_draw(seed, step, index, layers, B, S, r):
    """The draw before issue 42, kept here as the reference: one generator and rand + topk + sort per block."""
    out = {}
    for i in layers:
        g = torch.Generator().manual_seed(seed_for(seed, step, index, 0x17D, i))
        scores = torch.rand(B, S, generator=g, device=g.device)
        out[i] = scores.topk(r, dim=1, largest=False).indices.sort(dim=1).values
    return out


def technique(n_layer=6, S=64, B=16, min_len=16, step_len=8, seed=0, **kw):
    args = [f"--model.n_layer={n_layer}", f"--model.seq_len={S}", f"--train.batch_size={B}",
            f"--random_ltd.min_len={min_len}", f"--random_ltd.step_len={step_len}", f"--train.seed={seed}",
            "--random_ltd.enabled=true", "--random_ltd.ramp_steps=10"] + [f"--{k}={v}" for k, v in kw.items()]
    cfg = load_config(None, args)
    return RandomLTD(cfg.techniques["random_ltd"], cfg), cfg


@pytest.mark.parametrize("n_layer, S, B, min_len, step_len, layers", [
    (6, 64, 16, 16, 8, "[]"), (4, 32, 8, 1, 1, "[]"), (12, 1024, 4, 128, 16, "[]"),
    (5, 257, 3, 5, 7, "[0, 2, 4]"), (3, 8, 1, 7, 7, "[1]"), (8, 4096, 8, 1000, 64, "[]")])
def test_one_draw_is_bitwise_the_per_block_draws_on_cpu(n_layer, S, B, min_len, step_len, layers):
    """Every cached CPU result depends on these exact subsets: the one-topk draw must give them bit for bit,
    over seeds, steps, micro-steps, shapes (S up to 4096, where ties among the uniform scores occur: see below)."""
    for seed in (0, 7, 1337):
        t, cfg = technique(n_layer, S, B, min_len, step_len, seed, **{"random_ltd.layers": layers})
        for step in (0, 1, 4, 9):
            for micro in (0, 3):
                plan = Plan.full(n_layer)
                t.update_plan(plan, step, micro)
                if t.last_r >= S:
                    continue
                ref = per_block_draw(seed, step, micro, t.layers, B, S, t.last_r)
                for i in range(n_layer):
                    if i in ref:
                        assert torch.equal(plan.blocks[i].keep, ref[i]), (seed, step, micro, i)
                    else:
                        assert plan.blocks[i].keep is None


def test_batched_topk_equals_per_row_topk_with_ties():
    """kept_subsets runs one topk over (L, B, S); each row's indices are those of that row's own topk, also when
    the scores tie (uniform float32 scores have 2^24 values: in rows of 4096 a tie occurs in ~40% of rows, and
    here scores of 4 values tie everywhere, across the cut-off r too)."""
    g = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 4, (5, 6, 300), generator=g).float()
    uniform = torch.rand(4, 8, 4096, generator=g)
    assert (uniform.sort(-1).values.diff(dim=-1) == 0).any()           # real ties among uniform scores
    for scores in (ties, uniform):
        S = scores.size(-1)
        for r in (1, 2, S // 3, S // 2, S - 1):
            batched = kept_subsets(scores, r)
            for l in range(scores.size(0)):
                alone = scores[l].topk(r, dim=1, largest=False).indices.sort(dim=1).values  # the per-block form
                assert torch.equal(batched[l], alone), (S, r, l)
                for b in range(scores.size(1)):
                    row = scores[l, b].topk(r, largest=False).indices.sort().values
                    assert torch.equal(batched[l, b], row)


class _OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_one_topk_and_one_sort_for_all_blocks():
    t, _ = technique(n_layer=12, S=128, B=4, min_len=32)   # 10 dropping blocks
    with _OpCount() as c:
        t.update_plan(Plan.full(12), 0, 0)
    assert c.ops.count("topk") == 1 and c.ops.count("sort") == 1, c.ops    # the per-block loop: 10 and 10
    assert c.ops.count("uniform_") == 10                                    # CPU: one stream per block (the cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draw_is_one_generator_per_micro_step():
    t, cfg = technique(n_layer=6, S=64, B=16, min_len=16)
    t.device = torch.device("cuda")
    plan, again = Plan.full(6), Plan.full(6)
    with _OpCount() as c:
        t.update_plan(plan, 2, 1)
    assert c.ops.count("rand") + c.ops.count("uniform_") == 1 and c.ops.count("topk") == 1 and c.ops.count("sort") == 1
    t.update_plan(again, 2, 1)
    g = generator_for(0, 2, 1, _TAG, device="cuda")
    ref = kept_subsets(torch.rand(4, 16, 64, generator=g, device="cuda"), t.last_r)
    for j, i in enumerate(t.layers):
        assert plan.blocks[i].keep.is_cuda and torch.equal(plan.blocks[i].keep, again.blocks[i].keep)
        assert torch.equal(plan.blocks[i].keep, ref[j])
    freq = torch.cat([plan.blocks[i].keep for i in t.layers]).flatten().bincount(minlength=64)
    assert freq.sum() == 4 * 16 * t.last_r


# ----------------------------------------------------------------------------- one dynamic graph
def graphs_per_step(tiny_cfg, steps, **kw):
    """(kept length, graphs compiled so far) after each step of a compiled (aot_eager) random-LTD run, and
    whether its losses are bitwise those of the same run uncompiled."""
    torch._dynamo.reset()
    counters.clear()
    over = {"train.steps": steps, "train.compile": "blocks", "train.compile_backend": "aot_eager", **LTD, **kw}
    tr = Trainer(tiny_cfg(**over))
    plain = Trainer(tiny_cfg(**{k: v for k, v in over.items() if not k.startswith("train.compile")}))
    seen, same = [], True
    for _ in range(steps):
        same &= bool(torch.equal(tr.train_step(), plain.train_step()))
        seen.append((tr.techniques[0].last_r, counters["stats"]["unique_graphs"]))
    torch._dynamo.reset()
    return seen, same


# kept lengths 8, 8, 9, ..., 31 (24 lengths) over the ramp's 30 steps (step_len 1: a new length almost every step), then 32
RAMP = {"random_ltd.min_len": 8, "random_ltd.step_len": 1, "random_ltd.ramp_steps": 30}


def test_compiled_plain_run_makes_two_graphs(tiny_cfg):
    """The reference for the counts below: a block at full length (1 graph) and the head + loss (1 graph)."""
    torch._dynamo.reset()
    counters.clear()
    tr = Trainer(tiny_cfg(**{"train.compile": "blocks", "train.compile_backend": "aot_eager"}))
    for _ in range(3):
        tr.train_step()
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_dropped_blocks_compile_one_dynamic_graph_from_their_first_call(tiny_cfg):
    """Every block drops tokens (layers 0..3): the first kept length compiles the dropped blocks' only graph,
    a dynamic one, and no other length compiles anything (today's code compiled a static graph at r = 8 and
    recompiled it dynamic at r = 9); the full length, at the end of the ramp, compiles the plain block's graph
    (+1). With the head + loss: 2 graphs until the full length, 3 after."""
    seen, same = graphs_per_step(tiny_cfg, 33, **RAMP, **{"random_ltd.layers": "[0, 1, 2, 3]"})
    assert len({r for r, _ in seen if r < 32}) == 24                      # 24 dropped lengths
    assert all(n == 2 for r, n in seen if r < 32), seen                   # 1 dropped-block graph + the head's
    assert [n for r, n in seen if r == 32] == [3] * 3, seen               # + the plain block at full length
    assert same                                                           # aot_eager: bitwise the eager losses


def test_middle_blocks_compile_one_dynamic_graph_beside_the_plain_one(tiny_cfg):
    """The default layers (1 and 2 of 4): step 0 compiles the plain block (blocks 0 and 3), the dropped blocks'
    dynamic graph and the head + loss: 3 graphs, and none after, through 24 lengths and the full length."""
    seen, same = graphs_per_step(tiny_cfg, 33, **RAMP)
    assert all(n == 3 for _, n in seen), seen
    assert same


def test_kept_length_one_is_static_and_two_on_is_one_dynamic_graph(tiny_cfg):
    """Dynamo specializes sizes 0 and 1, so r = 1 is not marked (marking it would raise): it compiles its own
    static graph, and r >= 2 the one dynamic graph (2 dropped-block graphs where min_len = step_len = 1)."""
    seen, same = graphs_per_step(tiny_cfg, 6, **{"random_ltd.min_len": 1, "random_ltd.step_len": 1,
                                                  "random_ltd.ramp_steps": 30, "random_ltd.layers": "[0, 1, 2, 3]"})
    assert [r for r, _ in seen] == [1, 2, 3, 4, 5, 6]
    assert [n for _, n in seen] == [2, 3, 3, 3, 3, 3], seen
    assert same


class _Specializes(torch.nn.Module):
    """A block whose code depends on the token count's value (what a GPU attention kernel's constraints could do)."""

    def forward(self, x, scale=1.0):
        return x * 2 if x.size(1) % 4 == 0 else x + 1


def test_a_block_that_specializes_the_length_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setitem(transformer._DYNAMIC_KEPT, "strict", True)
    torch._dynamo.reset()
    blk = _Specializes()
    blk.compile(backend="aot_eager")
    x = torch.randn(2, 16, 3)
    for r in (8, 9):
        keep = torch.arange(r).expand(2, r)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = run_block(blk, x, BlockPlan(keep=keep))
        ref = x.clone()
        ref[:, :r] = x[:, :r] * 2 if r % 4 == 0 else x[:, :r] + 1
        assert torch.equal(y, ref)
        assert len([m for m in w if "dynamic size" in str(m.message)]) == (r == 8)   # said once
    assert transformer._DYNAMIC_KEPT["strict"] is False
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- attention backend
def _spy_attention(monkeypatch):
    """(T, backend PyTorch would pick at this call) for every attention call of the model."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.size(2), torch._fused_sdp_choice(q, k, v, **kw)))
        return sdpa(q, k, v, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def test_attention_choice_applies_to_the_dropped_blocks_only(tiny_cfg, monkeypatch):
    calls = _spy_attention(monkeypatch)
    tr = Trainer(tiny_cfg(**LTD, **{"random_ltd.min_len": 8, "random_ltd.attention": "math"}))
    assert calls == [(8, SDPBackend.MATH.value)]                                 # setup's probe of the choice
    calls.clear()
    tr.train_step()
    assert [T for T, _ in calls] == [32, 8, 8, 32]
    assert [c for T, c in calls if T == 8] == [SDPBackend.MATH.value] * 2        # the dropped blocks: math
    assert all(c != SDPBackend.MATH.value for T, c in calls if T == 32)          # the others: PyTorch's choice


def test_math_attention_trains_like_auto_and_auto_wraps_nothing(tiny_cfg):
    """Measured on a CPU (S = 32 and 64, 8 steps): the losses agree to the bit and the parameters to <= 1e-5;
    the CPU's auto choice is its flash kernel, which math matches to ~4e-7 per attention output."""
    for extra in ({}, {"model.seq_len": 64, "random_ltd.min_len": 24}):
        runs = {}
        for att in ("auto", "math", None):
            kw = {**LTD, "random_ltd.min_len": 8, **extra}
            if att is not None:
                kw["random_ltd.attention"] = att
            tr = Trainer(tiny_cfg(**kw))
            runs[att] = [float(tr.train_step()) for _ in range(8)], params(tr)
        # auto (the default) wraps nothing: the dropped blocks run run_block's own code, today's kernels
        tr = Trainer(tiny_cfg(**{**LTD, "random_ltd.min_len": 8, **extra, "random_ltd.attention": "auto"}))
        assert all(b.layer_fn is None for b in tr.plan(0, 0).blocks)
        assert max(abs(a - b) for a, b in zip(runs["auto"][0], runs["math"][0])) <= 1e-5
        assert (runs["auto"][1] - runs["math"][1]).abs().max() <= 1e-4


def test_attention_choice_works_through_the_layer_hook_and_compiled(tiny_cfg):
    """Notebook 03's hook keeps its contract under a backend choice: it is called for every dropping block,
    inside the choice; accellib's own layer through it gives the bits of no hook. Compiled blocks (aot_eager)
    trace the choice into the dropped blocks' graph: the same losses as eager."""
    kw = {**LTD, "random_ltd.min_len": 8, "random_ltd.attention": "math"}
    hooked = []

    def accellib_layer(x, keep, block):
        hooked.append(torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled())
        return run_block(block, x, BlockPlan(keep=keep))

    def losses(cfg, fn=None):
        tr = Trainer(cfg)
        tr.techniques[0].layer_fn = fn
        return [float(tr.train_step()) for _ in range(4)], params(tr)

    ref, p_ref = losses(tiny_cfg(**kw))
    same, p_same = losses(tiny_cfg(**kw), accellib_layer)
    assert same == ref and torch.equal(p_same, p_ref)
    assert len(hooked) == 8 and all(hooked)                              # 2 blocks x 4 steps, each under math
    assert torch.backends.cuda.flash_sdp_enabled()                       # and the choice ends with the block
    torch._dynamo.reset()
    comp, _ = losses(tiny_cfg(**kw, **{"train.compile": "blocks", "train.compile_backend": "aot_eager"}))
    torch._dynamo.reset()
    assert comp == ref


@pytest.mark.parametrize("att", ["efficient", "cudnn"])
def test_a_backend_the_device_lacks_is_refused_in_one_line(tiny_cfg, att):
    if torch.cuda.is_available():
        pytest.skip("CPU check: a CUDA device may have the backend")
    with pytest.raises(ConfigError, match=f"attention={att}.*backends that run here: auto, flash, math") as e:
        Trainer(tiny_cfg(**LTD, **{"random_ltd.attention": att}))
    assert "\n" not in str(e.value)
