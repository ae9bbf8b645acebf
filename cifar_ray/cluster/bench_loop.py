"""`cifar-ray bench`'s loop measurements (sections 1, 3 and 5 of cluster/bench.py): our loop without Ray, the plainest
PyTorch loop, and our data path against a torchvision DataLoader, each in this process.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..core.config import TrainConfig
from ..training.data import CIFAR_MEAN, CIFAR_STD, iterate_train, load_splits, normalise
from ..training.distributed import Worker
from ..training.flops import device_peak, throughput, training_flops_per_image
from ..training.loop import MEMORY_FORMAT, start_training, torch_threads, train_epoch
from ..training.models import build_model
from ..training.timing import PhaseTimer

MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def bare_loop(cfg: TrainConfig) -> dict:
    """Our loop without Ray: train_epoch in this process, cfg.cpus_per_worker threads; its model FLOP/s and MFU."""
    cpu = torch.device("cpu")
    with torch_threads(cfg.cpus_per_worker):
        train, _ = load_splits(cfg)
        flops: list[float] = []  # of the model as built, before the wrapper

        def as_built(model: torch.nn.Module) -> None:
            flops.append(training_flops_per_image(model))

        training = start_training(cfg, Worker.single(cpu), len(train) // cfg.effective_batch, prepare=as_built)
        flops_per_image, peak = flops[0], device_peak(cpu, cfg.amp)
        rates, phases, times = [], [], []
        for epoch in range(1, cfg.epochs + 1):
            timer = PhaseTimer(cpu)
            started = time.perf_counter()
            steps = iterate_train(train, cfg, epoch, 0, 1, MEMORY_FORMAT)
            totals = train_epoch(training, steps, cfg, cpu, timer)
            elapsed = time.perf_counter() - started
            rates.append(totals[2].item() / elapsed)
            times.append(elapsed)
            phases.append(timer.seconds())
    last = phases[-1]
    rate = median_after_warmup(rates)
    return {
        "samples_per_s": rate,
        **throughput(flops_per_image, rate, 1.0, peak.flops_per_s),  # flops_per_s, mfu
        "peak_source": peak.source,
        "epoch_time_s": median_after_warmup(times),
        "breakdown_s": last,
        "data_share": last.get("data", 0.0) / sum(last.values()),
    }


def bare_pytorch_loop(cfg: TrainConfig, memory_format: torch.memory_format) -> float:
    """Images/s of the plainest loop PyTorch allows for cfg's model, batch and threads: forward, loss, backward,
    SGD step on batches normalised beforehand (no data pipeline, no metrics, no schedule), in `memory_format`;
    the median over epochs after the first."""
    with torch_threads(cfg.cpus_per_worker):
        torch.manual_seed(cfg.seed)
        train, _ = load_splits(cfg)
        model = build_model(cfg).to(memory_format=memory_format).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        images = normalise(train.images).contiguous(memory_format=memory_format)
        batches = [
            (images[i : i + cfg.batch_size], train.labels[i : i + cfg.batch_size])
            for i in range(0, len(train) - cfg.batch_size + 1, cfg.batch_size)
        ]
        rates = []
        for _ in range(cfg.epochs):
            started = time.perf_counter()
            for x, y in batches:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            rates.append(len(batches) * cfg.batch_size / (time.perf_counter() - started))
    return median_after_warmup(rates)


def loader_comparison(cfg: TrainConfig, batches: int) -> dict:
    """Images/s of batch production only: ours (gather + normalise + flip/crop on tensors) vs a
    torchvision DataLoader with per-sample PIL transforms (the tutorial pipeline), one thread each."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms

    train, _ = load_splits(cfg)
    n = min(len(train), batches * cfg.batch_size)
    with torch_threads(1):
        started = time.perf_counter()
        produced = 0
        for step in iterate_train(train, cfg, 1, 0, 1):
            produced += sum(len(labels) for _, labels in step)
            if produced >= n:
                break
        ours = produced / (time.perf_counter() - started)

        pipeline = transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4, padding_mode="reflect"),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(CIFAR_MEAN, CIFAR_STD),
            ]
        )
        images = train.images[:n].permute(0, 2, 3, 1).numpy()
        labels = train.labels[:n]

        class PilDataset(torch.utils.data.Dataset):
            def __len__(self):
                return n

            def __getitem__(self, i):
                return pipeline(Image.fromarray(np.ascontiguousarray(images[i]))), labels[i]

        loader = torch.utils.data.DataLoader(PilDataset(), batch_size=cfg.batch_size, shuffle=True, num_workers=0)
        started = time.perf_counter()
        produced = sum(len(y) for _, y in loader)
        theirs = produced / (time.perf_counter() - started)
    return {"ours_images_per_s": ours, "dataloader_images_per_s": theirs, "speedup": ours / theirs}
