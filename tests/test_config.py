"""Config loading, overrides and one-line validation errors."""
from pathlib import Path

import pytest

from accellib.core.options import ConfigError
from accellib.core.config import help_text, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  n_layer: 6\ntrain:\n  steps: 10\n")
    cfg = load_config(p, ["--train.steps=20", "--optim.lr=1e-3", "--train.progress=false"])
    assert (cfg.model.n_layer, cfg.train.steps, cfg.optim.lr, cfg.train.progress) == (6, 20, 1e-3, False)
    assert isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize("args, needle", [
    (["--train.stepz=3"], "unknown config key 'train.stepz'"),
    (["--bogus.x=1"], "unknown config section 'bogus'"),
    (["--train.steps=abc"], "train.steps must be an integer"),
    (["--train.steps=1.5"], "train.steps must be an integer"),
    (["--train.progress=maybe"], "train.progress must be true or false"),
    (["--train.steps=0"], "train.steps=0 is below the minimum 1"),
    (["--train.precision=fp8"], "choose one of ['auto', 'fp32', 'bf16']"),
    (["--model.kind=rnn"], "choose one of ['gpt', 'mlm', 'vit', 'cnn', 'mlp']"),
    (["--model.d_model=30", "--model.n_head=4"], "divisible"),
    (["train.steps=3"], "write --section.key=value"),
])
def test_bad_values_give_one_line_errors(args, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_help_lists_every_option_with_default():
    h = help_text()
    for key in ("--train.steps=300", "--optim.lr=0.005", "--model.n_layer=4", "--data.path="):
        assert key in h


def test_parse_overrides_types():
    d = parse_overrides(["--a.b=[1, 2]", "--a.c=true", "--a.d=x"])
    assert d == {"a": {"b": [1, 2], "c": True, "d": "x"}}


def test_incompatible_techniques_fail_with_one_line_error():
    from accellib.techniques.base import Technique, check_composition

    class A(Technique):
        name, plan_fields = "a", ("run", "scale")

    class B(Technique):
        name, plan_fields = "b", ("run",)

    class C(Technique):
        name, plan_fields = "c", ("keep",)

    class D(Technique):
        name, incompatible = "d", ("c",)

    check_composition([A(None, None), C(None, None)])          # different plan fields compose
    with pytest.raises(ConfigError, match="a and b both decide the plan's 'run'"):
        check_composition([A(None, None), B(None, None)])
    with pytest.raises(ConfigError, match="d cannot be combined with c"):
        check_composition([C(None, None), D(None, None)])


def test_train_takes_one_arm_of_a_compare_yaml(tiny_data_dir, tmp_path, capsys):
    # `python -m accellib.train --config configs/tutorial.yaml` trains the tutorial baseline; --arm picks another
    # arm, exactly as compare would build it; a wrong arm or --arm with a plain config is one line
    import yaml
    from accellib.train import main, run_config
    from conftest import tiny_overrides
    base = parse_overrides(tiny_overrides(tiny_data_dir, **{"train.steps": 2}))
    base["arms"] = {"baseline": {}, "pld": {"pld": {"enabled": True}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(base))
    assert run_config(str(tmp_path / "c.yaml"), None, []).enabled() == []
    assert run_config(str(tmp_path / "c.yaml"), "pld", ["--train.steps=3"]).enabled() == ["pld"]
    assert run_config(str(ROOT / "configs" / "tutorial.yaml"), None, []).model.n_layer == 6
    assert main(["--config", str(tmp_path / "c.yaml"), "--arm", "pld", "--out", str(tmp_path / "run")]) == 0
    assert main(["--config", str(tmp_path / "c.yaml"), "--arm", "nope", "--out", str(tmp_path / "r2")]) == 2
    assert "unknown arm 'nope'" in capsys.readouterr().err
    assert main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--arm", "pld", "--out", str(tmp_path / "r3")]) == 2
    assert "needs a compare YAML" in capsys.readouterr().err
    (tmp_path / "broken.yaml").write_text("model: [\n")   # before: a yaml.ParserError traceback
    assert main(["--config", str(tmp_path / "broken.yaml"), "--out", str(tmp_path / "r4")]) == 2
    assert "broken.yaml is not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("text, key, lines", [
    ("model:\n  d_model: 32\n  n_layer: 2\n  d_model: 64\n", "model.d_model", (2, 4)),   # before: d_model 64
    ("model:\n  n_layer: 2\ntrain:\n  steps: 3\nmodel:\n  d_model: 64\n", "model", (1, 5)),  # before: n_layer lost
    ("arms:\n  - name: a\n    overrides: [x]\n    name: b\n", "arms[0].name", (2, 4)),
])
def test_a_duplicate_yaml_key_is_refused_in_one_line(tmp_path, text, key, lines):
    # issue 43: PyYAML keeps the second value of a key written twice without a word
    from accellib.core.config import read_yaml
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_yaml(p)
    msg = str(e.value)
    assert f"{p}: the key {key} is written twice (lines {lines[0]} and {lines[1]})" in msg and "\n" not in msg


def test_yaml_merges_and_aliases_are_not_duplicates(tmp_path):
    from accellib.core.config import read_yaml
    p = tmp_path / "c.yaml"
    p.write_text("base: &b\n  steps: 3\ntrain:\n  <<: *b\n  log_every: 1\nother: *b\n")
    assert read_yaml(p) == {"base": {"steps": 3}, "train": {"steps": 3, "log_every": 1}, "other": {"steps": 3}}
