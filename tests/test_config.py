import ast
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from cifar_ray import comm, config, data, datasets, models, optim, placement, sweep, train
from cifar_ray.config import KEYS, ConfigError, TrainConfig, key_rows, parse_config, parse_overrides


def test_defaults_are_valid_and_documented():
    cfg = TrainConfig()
    assert cfg.effective_batch == cfg.batch_size * cfg.accum_steps
    for key, field in TrainConfig.model_fields.items():
        assert field.description, f"{key} has no description"


def test_overrides_are_typed_like_yaml_scalars():
    values = parse_overrides(["lr=0.1", "workers=2", "use_gpu=false", "dataset=synthetic", "warmup_epochs=1"])
    assert values == {"lr": 0.1, "workers": 2, "use_gpu": False, "dataset": "synthetic", "warmup_epochs": 1}
    cfg = parse_config(values)
    assert cfg.use_gpu == "false" and cfg.warmup_epochs == 1.0


@pytest.mark.parametrize(
    "items, expected",
    [
        (["bach_size=3"], "unknown config key 'bach_size' (did you mean 'batch_size'?)"),
        (["lr"], "--set expects KEY=VALUE, got 'lr'"),
        (["=3"], "--set expects KEY=VALUE"),
    ],
)
def test_bad_override_syntax(items, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_overrides(items)


@pytest.mark.parametrize(
    "values, expected",
    [
        (
            {"optimizer": "adm"},
            "optimizer='adm': not allowed; allowed: one of sgd, momentum, nesterov, adam, adamw, rmsprop",
        ),
        ({"batch_size": "many"}, "batch_size='many': should be a valid integer; allowed: an integer"),
        ({"batch_size": 32.5}, "batch_size=32.5"),
        ({"lr": 0}, "lr=0: should be greater than 0"),
        ({"dropout": 1.0}, "dropout=1.0: should be less than 1"),
        ({"workers": 3, "batch_size": 128}, "batch_size=128 must be divisible by workers=3"),
        ({"strategy": "single", "workers": 2}, "strategy=single runs one process: workers must be 1"),
        ({"use_gpu": False, "backend": "nccl"}, "backend=nccl needs GPUs but use_gpu=false"),
        ({"use_gpu": "false", "amp": "fp16"}, "amp=fp16 needs a GPU"),
        (
            {"train_subset": 100, "batch_size": 64, "accum_steps": 2},
            "train_subset=100 is smaller than the effective batch 128",
        ),
        ({"colour": 1}, "unknown config key 'colour'"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(values, expected):
    with pytest.raises(ConfigError) as error:
        parse_config(values)
    message = str(error.value)
    assert expected in message
    assert "\n" not in message


def test_resolved_auto_values():
    cpu = TrainConfig().resolved(cluster_has_gpus=False)
    assert (cpu.use_gpu, cpu.backend) == ("false", "gloo")
    gpu = TrainConfig().resolved(cluster_has_gpus=True)
    assert (gpu.use_gpu, gpu.backend) == ("true", "nccl")
    assert TrainConfig(backend="gloo").resolved(True).backend == "gloo"
    with pytest.raises(ConfigError, match="use_gpu=true but the Ray cluster has no GPUs"):
        TrainConfig(use_gpu="true").resolved(cluster_has_gpus=False)
    with pytest.raises(ConfigError, match="backend=nccl needs GPUs"):
        TrainConfig(backend="nccl").resolved(cluster_has_gpus=False)


def test_batch_semantics():
    cfg = TrainConfig(batch_size=128, workers=2, accum_steps=4)
    assert (cfg.per_worker_batch, cfg.effective_batch, cfg.ray_workers) == (64, 512, 2)
    dp = TrainConfig(batch_size=128, workers=2, strategy="dp")
    assert (dp.per_worker_batch, dp.ray_workers) == (128, 1)


# Every Literal whose values name entries of a registry, with that registry: adding a model, optimizer,
# schedule... is one registry entry plus its name in the Literal, and this fails if either is forgotten.
BOUND_LITERALS = {
    "Dataset -> datasets.DATASET_SIZES": (config.Dataset, datasets.DATASET_SIZES),
    "Dataset -> data.DATASETS": (config.Dataset, data.DATASETS),
    "Augment -> data.AUGMENTATIONS": (config.Augment, data.AUGMENTATIONS),
    "ModelName -> models.MODELS": (config.ModelName, models.MODELS),
    "Norm -> models.NORMS": (config.Norm, models.NORMS),
    "Optimizer -> optim.OPTIMIZERS": (config.Optimizer, optim.OPTIMIZERS),
    "Scheduler -> optim.SCHEDULES": (config.Scheduler, optim.SCHEDULES),
    "LrScaling -> optim.LR_SCALING": (config.LrScaling, optim.LR_SCALING),
    "GradCompression -> comm.COMPRESSIONS": (config.GradCompression, comm.COMPRESSIONS),
    "Amp -> off + train.AMP_DTYPES": (config.Amp, {"off", *train.AMP_DTYPES}),
}


@pytest.mark.parametrize("pair", BOUND_LITERALS)
def test_each_literal_names_exactly_its_registry(pair):
    literal, registry = BOUND_LITERALS[pair]
    assert set(get_args(literal)) == set(registry), f"{pair}: the Literal in config.py and the registry differ"


def test_every_literal_key_is_bound_or_names_no_registry():
    """A new Literal key must be added to BOUND_LITERALS, or here if its values name no registry of ours."""
    no_registry = {"use_gpu", "backend", "strategy"}  # torch's backends; strategy is wrap_model's branches
    bound = {literal for literal, _ in BOUND_LITERALS.values()}
    literal_keys = {key for key, field in TrainConfig.model_fields.items() if get_args(field.annotation)}
    unbound = {key for key in literal_keys if TrainConfig.model_fields[key].annotation not in bound}
    assert unbound == no_registry


def test_fused_optimizers_are_registered_ones():
    assert set(optim.FUSED_ON_CUDA) <= set(optim.OPTIMIZERS)


def test_config_imports_nothing_of_the_package_but_errors():
    """config.py must stay importable without torch or Ray (the CLI's --help, --dry-run and errors)."""
    tree = ast.parse(Path(config.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("cifar_ray")):
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.startswith("cifar_ray")}
    assert imported == {"errors"}


def test_resolve_plan_refuses_bf16_compression_where_torch_refuses_its_hook(monkeypatch):
    plan = sweep.single_run_plan({"workers": 2, "grad_compression": "bf16"}, "bf16")
    capacity = {"gpus": 0}
    monkeypatch.setattr(comm, "bf16_hook_supported", lambda: False)
    with pytest.raises(ConfigError) as error:
        placement.resolve_plan(plan, capacity)
    assert str(error.value) == comm.BF16_UNSUPPORTED
    monkeypatch.setattr(comm, "bf16_hook_supported", lambda: True)
    resolved = placement.resolve_plan(plan, capacity).trials[0].config
    assert (resolved.grad_compression, resolved.use_gpu, resolved.backend) == ("bf16", "false", "gloo")


def test_key_rows_describe_every_field_in_order():
    rows = {row.key: row for row in key_rows()}
    assert tuple(rows) == KEYS
    assert rows["optimizer"] == (
        "optimizer",
        "str",
        "sgd, momentum, nesterov, adam, adamw, rmsprop, lars",
        "momentum",
        TrainConfig.model_fields["optimizer"].description,
    )
    assert (rows["width"].type, rows["width"].allowed, rows["width"].default) == ("int", ">= 1, <= 1024", "32")
    assert (rows["dropout"].type, rows["dropout"].allowed, rows["dropout"].default) == ("float", ">= 0, < 1", "0.0")
    assert (rows["lr"].allowed, rows["gpus_per_worker"].allowed) == ("> 0", "> 0, <= 1")
    assert (rows["compile"].type, rows["compile"].allowed, rows["compile"].default) == ("bool", "true, false", "false")
    assert (rows["data_dir"].type, rows["data_dir"].default) == ("str", "~/.cache/cifar-ray/data")
    assert all(row.description for row in rows.values())


def test_keys_text_aligns_columns_and_wraps_descriptions():
    text = config.format_keys_text(key_rows(), width=60)
    lines = text.splitlines()
    key_lines = [line for line in lines if not line.startswith(" ")]
    assert [line.split()[0] for line in key_lines] == ["KEY", *KEYS]
    type_columns = {len(line) - len(line.split(maxsplit=1)[1]) for line in key_lines}
    assert len(type_columns) == 1  # every type starts in one column
    description = TrainConfig.model_fields["train_eval_size"].description
    start = lines.index(next(line for line in key_lines if line.startswith("train_eval_size "))) + 1
    wrapped = textwrap.wrap(description, 56)
    assert [line.strip() for line in lines[start : start + len(wrapped)]] == wrapped
    assert all(len(line) <= 60 for line in lines if line.startswith(" "))
