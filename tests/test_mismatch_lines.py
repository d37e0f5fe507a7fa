"""A checkpoint from another config is refused in one line naming what differs (issue 43, item 4): `export` and
`evaluate` of a run whose config.yaml was edited after training, or whose checkpoint was copied from another run,
printed torch's 44- and 47-line `size mismatch` tracebacks. Each case failed before its fix."""
import shutil

import pytest

from accellib.core.checkpoint_shapes import differences, mismatch_line
from accellib.train import main as train_main, training_function

pytest.importorskip("transformers", reason="pip install -e '.[hf]' (make test installs it)")
from accellib.export import main as export_main  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_data_dir):
    from accellib.core.config import load_config
    from conftest import tiny_overrides
    out = tmp_path_factory.mktemp("mismatch") / "run"
    training_function(load_config(None, tiny_overrides(tiny_data_dir, **{"train.steps": 2})), out)
    return out


def edited(run, tmp_path, old, new):
    """A copy of `run` whose config.yaml says `new` where it said `old` (as a user editing it after training)."""
    out = tmp_path / "edited"
    shutil.copytree(run, out)
    text = (out / "config.yaml").read_text()
    assert old in text
    (out / "config.yaml").write_text(text.replace(old, new))
    return out


def one_line(capsys, main, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_export_names_the_shapes_that_differ(run, tmp_path, capsys):
    bad = edited(run, tmp_path, "d_model: 32", "d_model: 64")
    err = one_line(capsys, export_main, [str(bad), "--out", str(tmp_path / "hf")])
    assert f"{bad}/checkpoints/last/pytorch_model.bin does not fit {bad}/config.yaml" in err
    assert "the checkpoint has model.d_model=32 where the config has 64" in err
    assert "transformer.wte.weight: checkpoint [257, 32], config [257, 64]" in err and "and 50 more" in err
    assert "put back the config.yaml the checkpoint was trained with" in err
    assert not (tmp_path / "hf").exists()


def test_export_names_the_layers_the_config_lacks(run, tmp_path, capsys):
    bad = edited(run, tmp_path, "n_layer: 4", "n_layer: 2")
    err = one_line(capsys, export_main, [str(bad), "--out", str(tmp_path / "hf")])
    assert "the checkpoint has model.n_layer=4 where the config has 2" in err
    assert "24 parameter(s) of the checkpoint are not in the config's model (transformer.h.2.ln_1.weight" in err


def test_export_of_another_runs_checkpoint_copied_in(run, tiny_cfg, tmp_path, capsys):
    other = tmp_path / "other"
    training_function(tiny_cfg(**{"train.steps": 2, "model.n_layer": 2, "model.seq_len": 16}), other)
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    shutil.rmtree(bad / "checkpoints")
    shutil.copytree(other / "checkpoints", bad / "checkpoints")
    err = one_line(capsys, export_main, [str(bad), "--out", str(tmp_path / "hf")])
    assert "the checkpoint has model.seq_len=16, model.n_layer=2 where the config has 32, 4" in err
    assert "transformer.wpe.weight: checkpoint [16, 32], config [32, 32]" in err
    assert "24 parameter(s) of the config's model are not in the checkpoint (transformer.h.2.ln_1.weight" in err


def test_evaluate_says_it_in_one_line(run, tmp_path, capsys):
    pytest.importorskip("lm_eval", reason="pip install -e '.[hf]' (make test installs it)")
    from accellib.evaluate import main as evaluate_main
    bad = edited(run, tmp_path, "d_model: 32", "d_model: 64")
    before = (bad / "record.json").read_text()
    err = one_line(capsys, evaluate_main, [str(bad), "--limit", "1"])  # refused before any document is scored
    assert "does not fit" in err and "model.d_model=32 where the config has 64" in err
    assert (bad / "record.json").read_text() == before and not (bad / "hf").exists()


def test_the_helper_is_silent_when_the_checkpoint_fits():
    import torch
    from accellib.models.transformer import ModelConfig, Transformer
    m = ModelConfig(vocab_size=257, seq_len=16, n_layer=2, d_model=32, n_head=2)
    model = Transformer(m)
    assert mismatch_line(model.state_dict(), model, m) is None
    sd = dict(model.state_dict(), extra=torch.zeros(1))
    assert differences(sd, model.state_dict()) == "1 parameter(s) of the checkpoint are not in the config's model (extra)"


def test_train_refuses_a_duplicate_yaml_key_in_one_line(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1.0e-3\n  weight_decay: 0.1\n  lr: 3.0e-4\n")  # before: trained at 3e-4, silently
    err = one_line(capsys, train_main, ["--config", str(p), "--out", str(tmp_path / "r")])
    assert f"{p}: the key optim.lr is written twice (lines 2 and 4)" in err
    assert not (tmp_path / "r").exists()
