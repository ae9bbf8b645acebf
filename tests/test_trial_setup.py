"""One set-up of a trial's training (issue 37: it was written out four times): every path that trains a config
(a trial in its slot, `cifar-ray check`, --estimate's step time, `bench`'s bare loop) starts it with
training.loop.start_training, so they start from the same state."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import cifar_ray
from cifar_ray.core.config import TrainConfig
from cifar_ray.training import loop
from cifar_ray.training.distributed import Worker

PACKAGE = Path(cifar_ray.__file__).parent
CFG = TrainConfig(
    dataset="synthetic", train_subset=64, test_subset=32, train_eval_size=0, batch_size=16, epochs=1, width=4, depth=2
)


def test_only_start_training_builds_a_training():
    """build_training (wrapper, optimizer, schedule) is called in one place: start_training, which seeds and builds
    the model before it. A second caller is a second copy of the set-up."""
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                called = getattr(node, "func", None)
                name = getattr(called, "attr", None) or getattr(called, "id", None)
                if isinstance(node, ast.Call) and name == "build_training":
                    callers.append(f"{path.relative_to(PACKAGE)}:{function.name}")
    assert sorted(set(callers)) == ["training/loop.py:start_training"]


def test_every_path_that_trains_a_config_starts_from_the_same_state(tmp_path, monkeypatch):
    """The model's initial weights (in the loop's memory format) and the random stream training then draws from are
    the same in a trial, a check's steps, the step timing of --estimate and bench's bare loop."""
    from cifar_ray.cluster.bench_loop import bare_loop
    from cifar_ray.training.check_runs import train_steps
    from cifar_ray.training.step_time import timed_step

    started, current = {}, [""]
    build_training = loop.build_training

    def recording(cfg, model, *args, **kwargs):
        training = build_training(cfg, model, *args, **kwargs)
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        nhwc = all(p.is_contiguous(memory_format=loop.MEMORY_FORMAT) for p in model.parameters() if p.dim() == 4)
        started.setdefault(current[0], (weights, nhwc, torch.get_rng_state(), type(training.optimizer)))
        return training

    monkeypatch.setattr(loop, "build_training", recording)
    cpu = Worker.single(torch.device("cpu"))
    paths = {
        "trial": lambda: loop.run_trial(CFG, str(tmp_path), cpu, lambda metrics, folder: None),
        "check": lambda: train_steps(CFG, 1, cpu),
        "estimate": lambda: timed_step(CFG),
        "bench": lambda: bare_loop(CFG),
    }
    for name, run in paths.items():
        current[0] = name
        run()
    assert list(started) == list(paths)
    weights, _, rng, optimizer = started["trial"]
    for name, (its_weights, nhwc, its_rng, its_optimizer) in started.items():
        assert torch.equal(its_weights, weights) and nhwc, name
        assert torch.equal(its_rng, rng) and its_optimizer is optimizer, name
