import pytest

from cifar_ray.config import KEYS, ConfigError, TrainConfig, parse_config, parse_overrides


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


def test_readme_documents_every_key():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    missing = [key for key in KEYS if f"`{key}`" not in readme]
    assert not missing, f"README.md does not document {missing}"
