import ast
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from cifar_ray.cluster import placement
from cifar_ray.core import config, datasets, sweep
from cifar_ray.core.config import (
    KEYS,
    SEED_MAX,
    ConfigError,
    TrainConfig,
    parse_config,
    parse_overrides,
)
from cifar_ray.core.keys import format_keys_text, key_rows
from cifar_ray.core.strict_yaml import load_yaml
from cifar_ray.training import comm, data, models, optim
from cifar_ray.training import loop as train
from cifar_ray.training.distributed import rank_seed


def test_defaults_are_valid_and_documented():
    cfg = TrainConfig()
    assert cfg.effective_batch == cfg.batch_size * cfg.accum_steps
    for key, field in TrainConfig.model_fields.items():
        assert field.description, f"{key} has no description"


@pytest.mark.parametrize("key", [key for key in KEYS if TrainConfig.model_fields[key].annotation in (int, float)])
def test_a_boolean_is_no_number_for_any_numeric_key(key):
    """pydantic reads true as 1: `epochs: true` ran one epoch."""
    for value in (True, False):
        with pytest.raises(ConfigError, match=f"{key}={value}: true or false is not a number; allowed: a"):
            parse_config({key: value})


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
        (["epochs=1", "lr=0.1", "epochs=2"], "--set: epochs is given twice; allowed: each key once"),
        (["lr=0.1", " lr =0.1"], "--set: lr is given twice"),  # even with one value: one of them is a slip
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
            {"compile": True, "strategy": "dp", "workers": 2},
            "compile=true with strategy=dp recompiles the model on every step",
        ),
        (
            {"train_subset": 100, "batch_size": 64, "accum_steps": 2},
            "the effective batch 128 (batch_size x accum_steps) is larger than the 100 training images "
            "(cifar10, train_subset=100): not one optimizer step per epoch; allowed: an effective batch <= 100",
        ),
        (  # no subset: the dataset's size is the bound
            {"dataset": "synthetic", "batch_size": 25_600, "accum_steps": 2},
            "the effective batch 51200 (batch_size x accum_steps) is larger than the 50000 training images "
            "(synthetic, train_subset=0: all)",
        ),
        (  # a subset beyond the data is capped at it (data.load_splits): the cap is the bound
            {"train_subset": 80_000, "batch_size": 50_001},
            "larger than the 50000 training images (cifar10, train_subset=80000)",
        ),
        ({"seed": -1}, "seed=-1: should be greater than or equal to 0"),
        ({"epochs": 10**6 + 1}, "epochs=1000001: should be less than or equal to 1000000"),
        (
            {"seed": config.SEED_MAX + 1},
            f"seed={config.SEED_MAX + 1}: should be less than or equal to {config.SEED_MAX}",
        ),
        (
            {"norm": "group", "width": 17},
            "norm=group cannot split 17 channels into 2 groups of about 8 (model=simple_cnn width=17 depth=3 has "
            "layers of 17, 34, 68 channels); allowed: a width whose layers split evenly, e.g. 16, 18 "
            "(any multiple of 8)",
        ),
        ({"norm": "group", "model": "resnet9", "width": 25}, "(model=resnet9 width=25 has layers of 25, 50, 100, 200"),
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


def test_config_imports_nothing_of_the_package_but_errors_datasets_strict_yaml_and_text():
    """config.py must stay importable without torch or Ray (the CLI's --help, --dry-run and errors): of the package
    it imports only these four small core modules, none of which imports more than errors."""
    tree = ast.parse(Path(config.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("cifar_ray")):
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.startswith("cifar_ray")}
    assert imported == {"errors", "datasets", "strict_yaml", "text"}


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
    text = format_keys_text(key_rows(), width=60)
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


FLOAT_KEYS = [key for key, field in TrainConfig.model_fields.items() if field.annotation is float]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", ".inf", "-.inf", ".nan", "Infinity"])
def test_inf_and_nan_are_refused_for_every_float_key(key, text):
    """inf passes lr > 0 and weight_decay >= 0 and nan fails only in training; --set and YAML read them alike."""
    with pytest.raises(ConfigError) as error:
        parse_config(parse_overrides([f"{key}={text}"]))
    assert str(error.value).startswith(f"{key}=") and "should be a finite number; allowed: a number" in str(error.value)


def test_float_keys_are_the_ones_expected():
    assert {"lr", "weight_decay", "warmup_epochs", "momentum", "label_smoothing", "dropout"} <= set(FLOAT_KEYS)


def test_seeds_up_to_seed_max_seed_every_generator_and_beyond_do_not():
    """SEED_MAX is where the seeds data.py and distributed.py derive (per epoch, per rank) still fit torch's generators:
    at it the last epoch of the longest run on 1024 ranks seeds fine; beyond it they overflow, in the worker."""
    import torch

    split = data.synthetic_cifar(1024, split_seed=0)
    world = 1024

    def seed_everything(seed: int) -> None:
        cfg = TrainConfig.model_construct(**(TrainConfig().model_dump() | {"seed": seed, "batch_size": world}))
        torch.manual_seed(rank_seed(seed, world - 1))
        next(data.iterate_train(split, cfg, config.EPOCHS_MAX, world - 1, world))  # seeds by epoch and rank

    seed_everything(TrainConfig(seed=SEED_MAX, epochs=config.EPOCHS_MAX).seed)
    with pytest.raises((ValueError, RuntimeError)):
        seed_everything(SEED_MAX * 2**20)


def model_builds(values: dict) -> bool:
    import torch

    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        try:
            models.build_model(TrainConfig.model_construct(**(TrainConfig().model_dump() | values)))
        except ValueError:
            return False
    return True


def config_accepts(values: dict) -> bool:
    try:
        parse_config(values)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("model", get_args(config.ModelName))
@pytest.mark.parametrize("norm", get_args(config.Norm))
def test_the_config_accepts_a_norm_and_width_exactly_when_the_model_builds(model, norm):
    depths = range(1, 6) if model == "simple_cnn" else [3]
    cases = [{"model": model, "norm": norm, "width": w, "depth": d} for w in [*range(1, 66), 100, 1000] for d in depths]
    disagree = [case for case in cases if config_accepts(case) != model_builds(case)]
    assert not disagree
    if norm == "group":  # the check is not vacuous: some widths cannot build
        assert not all(map(config_accepts, cases))


def test_yaml_reads_yes_no_on_off_as_text_and_true_false_as_bools():
    """YAML 1.1 reads off/on/yes/no as booleans: amp: off would be False, which amp refuses."""
    assert load_yaml("{amp: off, compile: yes, use_gpu: false, x: [on, no, True]}") == {
        "amp": "off",
        "compile": "yes",
        "use_gpu": False,
        "x": ["on", "no", True],
    }
    values = parse_overrides(["amp=off", "compile=yes", "static_graph=off", "use_gpu=false"])
    assert values == {"amp": "off", "compile": "yes", "static_graph": "off", "use_gpu": False}
    cfg = parse_config(values)
    assert (cfg.amp, cfg.compile, cfg.static_graph, cfg.use_gpu) == ("off", True, False, "false")


@pytest.mark.parametrize("text, digits", [("010", "10"), ("-07", "7"), ("00", "0"), ("0_1", "1")])
def test_an_integer_with_a_leading_zero_is_refused_naming_it(text, digits):
    """YAML 1.1 reads 010 as octal 8: epochs=010 would run 8 epochs."""
    with pytest.raises(ConfigError) as error:
        parse_overrides([f"epochs={text}"])
    assert str(error.value) == (
        f"--set: epochs: {text} is an integer written with a leading zero (YAML 1.1 reads it as octal); "
        f"allowed: {digits}, or '{text}' in quotes for text"
    )
    assert load_yaml(f"'{text}'") == text and load_yaml("[0, 10, 0x10, 1_000, 0.5, 1:30]") == [
        0,
        10,
        16,
        1000,
        0.5,
        "1:30",
    ]


def test_a_mapping_that_repeats_a_key_is_refused_naming_it_and_its_lines():
    with pytest.raises(config.YamlValueError) as error:
        load_yaml("name: s\ngrid: {lr: [0.1]}\nbase: {}\ngrid: {lr: [0.2]}\n")
    assert (str(error.value), error.value.line) == ("duplicate key 'grid' (first at line 2); allowed: each key once", 4)
    with pytest.raises(config.YamlValueError, match="duplicate key 'lr' \\(first at line 1\\)"):
        load_yaml("base: {lr: 0.1, epochs: 1, lr: 0.2}")
    assert load_yaml("a: &x {k: 1}\nb: {<<: *x, k: 2}\n")["b"] == {"k": 2}  # a merge key is no repeat
