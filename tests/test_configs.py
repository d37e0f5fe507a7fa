"""The shipped configs: every one loads, and the GPU-scale ones read the folder that
data_scripts/prepare_hf.py writes by default and refuse to run without CUDA."""
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # data_scripts/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from accellib.core.config import load_config  # noqa: E402
from accellib.data.tokens import prepare_hint  # noqa: E402
from data_scripts.prepare_hf import default_out_dir  # noqa: E402

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))  # configs/accelerate/ holds accelerate's own files
GPU_SCALE = {  # config -> the prepare_hf.py --dataset it trains on (all with the GPT-2 tokenizer)
    "gpt2_small_owt": "openwebtext", "multilevel_gpt_base": "openwebtext", "pld_gpt2_medium_owt": "openwebtext",
    "random_ltd_gpt2_medium_owt": "openwebtext", "random_ltd_gpt2_small_owt": "openwebtext",
    "pld_bert_base": "wikitext-103",
}
IMAGE = {"digits_cnn": "digits", "digits_cnn_sl": "digits", "mnist_cnn": "mnist", "cifar10_vit_sl": "cifar10"}
IMAGE_GPU = {"cifar10_vit_sl"}
FRESH_TEXT = {"overtrained": "debian_docs"}   # data_scripts/prepare_debian_docs.py: the over-trained regime's corpus


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads(path):
    if "\narms:" in path.read_text():  # the main job's file: a base config plus arms, for accellib.compare
        from accellib.drivers.arms import arm_configs
        cfg = arm_configs(path, None, None)["baseline"]
    else:
        cfg = load_config(path)
    if path.stem in GPU_SCALE:
        assert cfg.train.device == "cuda"  # a run without CUDA fails in one line, not after days on a CPU
    elif path.stem in IMAGE:
        assert Path(cfg.data.path).name == IMAGE[path.stem]
        assert cfg.train.device == ("cuda" if path.stem in IMAGE_GPU else "auto")
    elif path.stem in FRESH_TEXT:
        assert cfg.train.device == "auto" and Path(cfg.data.path).name == FRESH_TEXT[path.stem]
        assert cfg.data.windows == "disjoint"   # fresh data: no window read twice
    else:
        assert cfg.train.device == "auto" and Path(cfg.data.path).name == "shakespeare"


def test_every_gpu_scale_config_is_listed():
    assert set(GPU_SCALE) <= {p.stem for p in CONFIGS}
    cuda = {p.stem for p in CONFIGS if "device: cuda" in p.read_text()}
    assert cuda == set(GPU_SCALE) | IMAGE_GPU
    assert set(IMAGE) <= {p.stem for p in CONFIGS}


@pytest.mark.parametrize("name,folder", sorted(IMAGE.items()))
def test_image_config_names_the_command_that_writes_its_data(name, folder):
    from accellib.data.images import image_hint
    path = ROOT / "configs" / f"{name}.yaml"
    cfg = load_config(path) if "\narms:" not in path.read_text() else None
    data = ROOT / (cfg.data.path if cfg else f"data/{folder}")
    command = image_hint(data, force=False).removeprefix("run `").removesuffix("`")
    assert command.startswith("python data_scripts/prepare_") and command in path.read_text()


@pytest.mark.parametrize("name,dataset", sorted(GPU_SCALE.items()))
def test_gpu_scale_config_reads_what_prepare_hf_writes(name, dataset):
    path = ROOT / "configs" / f"{name}.yaml"
    default = default_out_dir(dataset, "gpt2")
    assert ROOT / load_config(path).data.path == default
    command = f"python data_scripts/prepare_hf.py --dataset {dataset} --tokenizer gpt2"
    # the hint for missing data, and the Prepare: comment at the top of the config
    assert prepare_hint(default, force=False) == f"run `{command}`"
    assert re.search(rf"^# Prepare: +{re.escape(command)}$", path.read_text(), re.M)


def test_documented_prepare_commands_write_where_the_configs_read():
    # notebooks 01/03/04 once told students to prepare into data/owt_gpt2, a folder no config reads
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb")),
            *sorted((ROOT / "notebooks" / "solutions").glob("*.md"))]
    read = {str(ROOT / load_config(ROOT / "configs" / f"{n}.yaml").data.path) for n in GPU_SCALE}
    found = 0
    for doc in docs:
        for m in re.finditer(r"prepare_hf\.py --dataset (\S+) --tokenizer (gpt2)(?: --out (\S+))?", doc.read_text()):
            found += 1
            dataset, tok, out = m.groups()
            dest = ROOT / out.rstrip("\\n\",") if out else default_out_dir(dataset, tok)
            assert str(dest) in read, f"{doc.name}: {m.group(0)} writes {dest}, which no GPU-scale config reads"
    assert found >= 3  # the README and the notebooks do show these commands


@pytest.mark.parametrize("name", ["random_ltd_gpt2_small_owt", "random_ltd_gpt2_medium_owt"])
def test_random_ltd_pretraining_configs_use_the_layer_token_schedule(name):
    # Yao et al. 2022 (§3.3, App. C): pretraining keys the LR warm-up/decay and the stop to consumed LayerTokens
    c = load_config(ROOT / "configs" / f"{name}.yaml")
    ltd = c.techniques["random_ltd"]
    assert ltd.enabled and ltd.layer_token_lr and ltd.draws == "per_rank"
    assert 0 < ltd.budget_steps <= c.train.steps           # the budget ends the run; train.steps is only a cap
    assert 0 < ltd.ramp_steps < ltd.budget_steps


def test_multilevel_gpt_base_follows_the_papers_recipe():
    # Zou et al. 2024, the experiment setup for GPT-Base: peak LR 1e-4, batch 256, 10K warm-up steps, alpha 0.25
    c = load_config(ROOT / "configs" / "multilevel_gpt_base.yaml")
    ml, t = c.techniques["multilevel"], c.train
    assert c.optim.lr == 1e-4 and c.optim.warmup_steps == 10_000 and ml.alpha == 0.25
    assert t.batch_size * t.grad_accum * 8 == 256           # 8 GPUs, as the config's launch command
    assert round(ml.warm_frac * t.steps) == c.optim.warmup_steps   # coalesced at the end of the warm-up
    assert (ml.width_pairing, ml.depth_pairing) == ("half", "adjacent") and not c.model.tie_head
