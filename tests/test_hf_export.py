"""HuggingFace transformers export and import (issue 14): the same function on both sides, to 1e-5."""
import json

import pytest
import torch

from accellib.core.options import ConfigError
from accellib.core.config import load_config
from accellib.models.hf_gpt2 import ExportError
from accellib.export import export_run, main as export_main
from accellib.models.transformer import Transformer
from accellib.core.tasks import make_task
from accellib.train import main as train_main, training_function
from conftest import tiny_overrides

transformers = pytest.importorskip("transformers", reason="pip install -e '.[hf]' (make test installs it)")


def hf_logits(hf_dir, idx):
    m = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        return m(idx).logits


def accellib_logits(run_dir, idx):
    from accellib.export import run_weights
    cfg, sd, _ = run_weights(run_dir)
    m = Transformer(cfg.model).eval()
    m.load_state_dict(sd)
    with torch.no_grad():
        return m(idx)[0]


def windows(n=3, t=32, v=257, seed=1):
    return torch.randint(v, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kw", [
    {"model.tie_head": True},
    {"model.tie_head": False, "model.bias": False},
    {"model.tie_head": False, "model.act": "gelu_tanh", "pld.enabled": True, "random_ltd.enabled": True},
], ids=["tied", "untied_nobias", "tanh_pld_ltd"])
def test_exported_model_computes_the_same_logits(tiny_cfg, tmp_path, kw):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 3, **kw}), run)
    info = export_run(run, tmp_path / "hf")
    idx = windows()
    diff = (hf_logits(tmp_path / "hf", idx) - accellib_logits(run, idx)).abs().max().item()
    assert diff <= 1e-5 and info["max_logit_diff"] <= 1e-5, diff
    hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_cfg["tie_word_embeddings"] == kw["model.tie_head"] and hf_cfg["n_positions"] == 32
    assert info["step"] == 3 and json.loads((tmp_path / "hf" / "accellib_export.json").read_text()) == info


def test_exported_byte_tokenizer_encodes_bytes(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 1}), run)
    export_run(run, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "Thou art, my lord — ünïcode\tand\nnewlines 日本"
    assert tok(text).input_ids == list(text.encode()) and tok.decode(tok(text).input_ids) == text
    assert tok.eos_token_id == 256 and tok.model_max_length == 32


def test_vcycle_final_model_exports(tiny_data_dir, tmp_path):
    from test_multilevel import vcycle_overrides
    run = tmp_path / "ml"
    assert train_main(["--out", str(run), *vcycle_overrides(tiny_data_dir)]) == 0
    info = export_run(run, tmp_path / "hf")
    idx = windows()
    assert (hf_logits(tmp_path / "hf", idx) - accellib_logits(run, idx)).abs().max().item() <= 1e-5
    assert info["step"] == json.loads((run / "vcycle.json").read_text())["done"]["2"]["step"]


@pytest.mark.parametrize("kw, words", [
    ({"model.kind": "mlm"}, "model.kind=mlm has no GPT-2 counterpart"),
    ({"model.norm": "none"}, "model.norm=none"),
], ids=["mlm", "no_layernorm"])
def test_what_gpt2_cannot_compute_is_refused_in_one_line(tiny_cfg, tmp_path, capsys, kw, words):
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 1, **kw}), run)
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


def test_a_failed_export_keeps_the_previous_one(tiny_cfg, tmp_path, monkeypatch, capsys):
    import accellib.export as ex
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 1}), run)
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "largest logit difference" in capsys.readouterr().out
    before = (tmp_path / "hf" / "model.safetensors").read_bytes()
    monkeypatch.setattr(ex, "MAX_LOGIT_DIFF", -1.0)     # every check fails
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]   # no staging folder left
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    assert export_main([str(run), "--out", str(tmp_path / "notes")]) == 2   # a folder of other files
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- import
def tiny_gpt2(path, vocab=257, positions=48, tie=True, act="gelu_new"):
    """A randomly initialised GPT2LMHeadModel saved locally: no download."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=32, n_layer=3, n_head=4,
                                  activation_function=act, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():  # GPT-2 initialises LayerNorms to (1, 0) and biases to 0: make them matter
        for n, p in m.named_parameters():
            if n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0, 0.1)
    m.save_pretrained(path)
    return m.eval()


@pytest.mark.parametrize("tie", [True, False])
def test_import_computes_gpt2s_logits(tiny_data_dir, tmp_path, tie):
    hf = tiny_gpt2(tmp_path / "gpt2", tie=tie)
    cfg = load_config(None, tiny_overrides(tiny_data_dir, **{"model.init_from": f"hf:{tmp_path / 'gpt2'}",
                                                             "model.n_layer": 5, "model.d_model": 64}))
    task = make_task(cfg)
    task.configure()
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.act, cfg.model.tie_head) == (3, 32, "gelu_tanh", tie)
    model = task.build_model().eval()
    idx = windows()
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5


def test_import_then_export_round_trips_and_any_technique_trains_on(tiny_data_dir, tmp_path):
    hf = tiny_gpt2(tmp_path / "gpt2")
    init = f"--model.init_from=hf:{tmp_path / 'gpt2'}"
    # lr 0 and no weight decay: the weights stay GPT-2's, so the export must give back GPT-2's logits
    assert train_main(["--out", str(tmp_path / "same"), *tiny_overrides(tiny_data_dir), init,
                       "--optim.lr=0", "--optim.weight_decay=0", "--train.steps=1"]) == 0
    export_run(tmp_path / "same", tmp_path / "back")
    idx = windows()
    with torch.no_grad():
        assert (hf_logits(tmp_path / "back", idx) - hf(idx).logits).abs().max().item() <= 1e-5
    # a technique continues from it; the first logged loss is the pretrained model's, not a fresh one's
    assert train_main(["--out", str(tmp_path / "ltd"), *tiny_overrides(tiny_data_dir), init,
                       "--random_ltd.enabled=true", "--sbld.enabled=true"]) == 0
    assert train_main(["--out", str(tmp_path / "pld"), *tiny_overrides(tiny_data_dir), init, "--pld.enabled=true"]) == 0
    stored = load_config(tmp_path / "pld" / "config.yaml")
    assert stored.model.n_layer == 3 and stored.model.init_from.startswith("hf:")
    assert train_main(["--resume", str(tmp_path / "pld"), "--train.steps=8"]) == 0   # the checkpoint wins
    from accellib.core.records import read_metrics
    assert read_metrics(tmp_path / "pld")[-1]["step"] == 8


def test_import_pads_a_smaller_vocabulary(tiny_data_dir, tmp_path):
    hf = tiny_gpt2(tmp_path / "gpt2", vocab=256)           # the data has 257 ids (bytes + [MASK])
    cfg = load_config(None, tiny_overrides(tiny_data_dir, **{"model.init_from": f"hf:{tmp_path / 'gpt2'}"}))
    task = make_task(cfg)
    task.configure()
    model = task.build_model()
    assert cfg.model.vocab_size == 257
    assert torch.equal(model.transformer.wte.weight[:256], hf.transformer.wte.weight)


@pytest.mark.parametrize("make, kw, words", [
    (None, {}, "no transformers checkpoint there"),
    (dict(vocab=300), {}, "has 300 token ids but the data has 257"),
    (dict(positions=16), {}, "model.seq_len=32 is longer than"),
    (dict(act="relu"), {}, "activation 'relu'"),
    (dict(), {"model.kind": "mlm"}, "needs model.kind=gpt"),
], ids=["missing", "vocab", "positions", "activation", "mlm"])
def test_import_refusals_are_one_line(tiny_data_dir, tmp_path, capsys, make, kw, words):
    if make is not None:
        tiny_gpt2(tmp_path / "gpt2", **make)
        capsys.readouterr()                              # (transformers' own progress bar)
    argv = ["--out", str(tmp_path / "run"), *tiny_overrides(tiny_data_dir, **kw),
            f"--model.init_from=hf:{tmp_path / 'gpt2'}"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    with pytest.raises(ConfigError, match="not hf:PATH_OR_NAME"):
        load_config(None, ["--model.init_from=gpt2"])


def test_a_vcycle_starts_from_the_imported_model(tiny_data_dir, tmp_path):
    # the V-cycle's first stage trains the full model: it is the one that starts from GPT-2 (the later
    # stages start from the mapped weights of the stage before); lr 0 keeps stage 0's result at GPT-2's weights
    from test_multilevel import vcycle_overrides
    from accellib.models.hf_gpt2 import from_gpt2_state
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=257, n_positions=48, n_embd=32, n_layer=4, n_head=4,
                                  activation_function="gelu_new", tie_word_embeddings=False)
    hf = transformers.GPT2LMHeadModel(cfg)
    hf.save_pretrained(tmp_path / "gpt2")
    assert train_main(["--out", str(tmp_path / "ml"), *vcycle_overrides(tiny_data_dir), "--optim.lr=0",
                       "--optim.weight_decay=0", f"--model.init_from=hf:{tmp_path / 'gpt2'}"]) == 0
    stored = load_config(tmp_path / "ml" / "config.yaml")
    stage0 = torch.load(tmp_path / "ml" / "stage_0" / "final_model.pt", weights_only=True)
    for k, v in from_gpt2_state(hf.state_dict(), stored.model).items():
        assert torch.equal(stage0[k], v), k
    coarse = json.loads((tmp_path / "ml" / "vcycle.json").read_text())["stages"][1]["model"]
    assert (coarse["n_head"], coarse["d_model"], coarse["act"]) == (2, 16, "gelu_tanh")   # GPT-2's shape, coalesced


# ----------------------------------------------------------------------------- a padded vocabulary
@pytest.fixture(scope="module")
def gpt2_like_dir(tmp_path_factory):
    from test_model import gpt2_like_folder
    return gpt2_like_folder(tmp_path_factory.mktemp("data") / "gpt2_like")


@pytest.mark.parametrize("tie", [True, False])
def test_export_drops_the_padding_rows(gpt2_like_dir, tmp_path, tie):
    run = tmp_path / "run"
    training_function(load_config(None, tiny_overrides(gpt2_like_dir, **{"train.steps": 2, "model.tie_head": tie})), run)
    assert load_config(run / "config.yaml").model.vocab_size == 50304          # trained padded
    info = export_run(run, tmp_path / "hf")
    assert (info["vocab_size"], info["padding_rows_dropped"], info["tokenizer"]) == (50257, 47, "gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert hf.config.vocab_size == 50257 and hf.transformer.wte.weight.shape[0] == 50257
    assert hf.lm_head.weight.shape[0] == 50257 and hf.config.tie_word_embeddings == tie
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token_id == 50256
    idx = windows(v=50257)
    ours = accellib_logits(run, idx)
    assert ours.shape[-1] == 50304
    assert (hf_logits(tmp_path / "hf", idx) - ours[..., :50257]).abs().max().item() <= 1e-5
    assert info["max_logit_diff"] <= 1e-5


def test_import_into_a_padded_vocabulary(gpt2_like_dir, tmp_path):
    hf = tiny_gpt2(tmp_path / "gpt2", vocab=50257)                            # GPT-2's 50,257 ids
    cfg = load_config(None, tiny_overrides(gpt2_like_dir, **{"model.init_from": f"hf:{tmp_path / 'gpt2'}"}))
    task = make_task(cfg)
    task.configure()
    assert cfg.model.vocab_size == 50304
    torch.manual_seed(0)
    model = task.build_model().eval()
    torch.manual_seed(0)
    fresh = Transformer(cfg.model).transformer.wte.weight                    # the same init, nothing copied
    assert torch.equal(model.transformer.wte.weight[:50257], hf.transformer.wte.weight)
    assert torch.equal(model.transformer.wte.weight[50257:], fresh[50257:])  # the padding rows keep their init
    idx = windows(v=50257)
    with torch.no_grad():
        assert (model(idx)[0][..., :50257] - hf(idx).logits).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------- what an export leaves behind
def test_a_low_precision_run_says_the_emulation_is_dropped(tiny_cfg, tmp_path, capsys):
    # the run computed its GEMMs with FP8 operands and a 16-bit accumulator; the GPT-2 computes them in fp32
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 1, "lowp.enabled": True}), run)
    capsys.readouterr()
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "lowp" in out and "emulation is dropped" in out and "fp32" in out, out
    info = json.loads((tmp_path / "hf" / "accellib_export.json").read_text())
    assert info["lowp_dropped"]["operand"] == "e5m2" and any("emulation is dropped" in n for n in info["notes"])
    plain = tmp_path / "plain"                       # a plain run's export says nothing of the kind
    training_function(tiny_cfg(**{"train.steps": 1}), plain)
    info = export_run(plain, tmp_path / "hf2")
    assert info["lowp_dropped"] is None and info["notes"] == []


def test_a_moved_corpus_says_why_there_is_no_tokenizer(tiny_data_dir, tmp_path, capsys):
    import shutil
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_data_dir, corpus)
    run = tmp_path / "run"
    training_function(load_config(None, tiny_overrides(corpus, **{"train.steps": 1})), run)
    corpus.rename(tmp_path / "moved")
    capsys.readouterr()
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 and "no tokenizer" in lines[0], out
    note = lines[1]
    assert str(corpus) in note and "does not exist" in note and "--data" in note, note
    info = json.loads((tmp_path / "hf" / "accellib_export.json").read_text())
    assert info["tokenizer"] is None and info["notes"] == [note.removeprefix("note: ")]
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    # the fix the line names: the folder it moved to
    assert export_main([str(run), "--out", str(tmp_path / "hf"), "--data", str(tmp_path / "moved")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "byte tokenizer" in out, out
    info = json.loads((tmp_path / "hf" / "accellib_export.json").read_text())
    assert info["tokenizer"] == "byte" and info["notes"] == [] and info["data"] == str(tmp_path / "moved")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token_id == 256
    # a --data folder that is missing, or not this model's corpus, is refused in one line
    assert export_main([str(run), "--out", str(tmp_path / "hf"), "--data", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data" in err and "nowhere" in err, err


@pytest.mark.parametrize("where", ["under_a_file", "read_only"])
def test_an_out_that_cannot_be_created_is_one_line(where, tiny_cfg, tmp_path, capsys):
    # issue 36 item 6: before, a traceback (NotADirectoryError / PermissionError)
    import os
    from accellib.export import main as export_main
    from accellib.train import training_function
    run = tmp_path / "run"
    training_function(tiny_cfg(**{"train.steps": 1}), run)
    (tmp_path / "f").write_text("a file")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    out = tmp_path / "f" / "hf" if where == "under_a_file" else ro / "sub" / "hf"
    try:
        if where == "read_only" and os.access(ro, os.W_OK):
            pytest.skip("running as a user who may write anywhere")
        assert export_main([str(run), "--out", str(out)]) == 2
    finally:
        ro.chmod(0o700)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot be created" in err and err.count("\n") == 1, err
