"""CNNs for 32x32 images, chosen by name from MODELS."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..core.config import TrainConfig, group_norm_groups

NUM_CLASSES = 10


# Normalisation after a conv, by name: channels -> layer. group uses 8 channels per group (Wu & He
# 2018 found 16-32 groups best; 8 channels keeps small widths valid; config.group_norm_groups, which
# TrainConfig checks); layer = one group over C,H,W.
NORMS: dict[str, Callable[[int], nn.Module]] = {
    "batch": lambda channels: nn.BatchNorm2d(channels),
    "group": lambda channels: nn.GroupNorm(group_norm_groups(channels), channels),
    "layer": lambda channels: nn.GroupNorm(1, channels),
    "instance": lambda channels: nn.InstanceNorm2d(channels, affine=True),
    "none": lambda channels: nn.Identity(),
}


def conv_block(c_in: int, c_out: int, norm: str) -> nn.Sequential:
    # A norm layer makes the conv bias redundant; keep it only without one.
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm == "none"),
        NORMS[norm](c_out),
        nn.ReLU(inplace=True),
    )


class SimpleCNN(nn.Module):
    """The assignment-style CNN: `depth` blocks of [conv-norm-ReLU x2, max-pool 2], channels
    width, 2*width, 4*width..., then flatten -> dropout -> FC 256 -> ReLU -> dropout -> FC 10.
    The fully connected head makes it able to overfit, which the regularisation sweeps need."""

    def __init__(self, width: int = 32, depth: int = 3, norm: str = "batch", dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i in range(depth):
            c_out = width * 2**i
            layers += [conv_block(c_in, c_out, norm), conv_block(c_out, c_out, norm), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        side = 32 // 2**depth
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(c_in * side * side, 256),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(256, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Residual(nn.Module):
    def __init__(self, channels: int, norm: str):
        super().__init__()
        self.body = nn.Sequential(conv_block(channels, channels, norm), conv_block(channels, channels, norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNet9(nn.Module):
    """The fast CIFAR ResNet-9 of Page (2018) / airbench: prep conv, three pooled stages
    (residual blocks after the first and last), global max-pool, linear head scaled by 1/8.
    width=64 is the original network (6.5 M parameters)."""

    def __init__(self, width: int = 64, norm: str = "batch", dropout: float = 0.0):
        super().__init__()
        w = width

        def stage(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm == "none"),
                nn.MaxPool2d(2),
                NORMS[norm](c_out),
                nn.ReLU(inplace=True),
            )

        self.net = nn.Sequential(
            conv_block(3, w, norm),
            stage(w, 2 * w),
            Residual(2 * w, norm),
            stage(2 * w, 4 * w),
            stage(4 * w, 8 * w),
            Residual(8 * w, norm),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(8 * w, NUM_CLASSES, bias=False),
        )
        self.logit_scale = 0.125  # keeps initial logits small, as in Page's DAWNBench entry

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.logit_scale


MODELS: dict[str, Callable[[TrainConfig], nn.Module]] = {
    "simple_cnn": lambda cfg: SimpleCNN(cfg.width, cfg.depth, cfg.norm, cfg.dropout),
    "resnet9": lambda cfg: ResNet9(cfg.width, cfg.norm, cfg.dropout),
}


def build_model(cfg: TrainConfig) -> nn.Module:
    return MODELS[cfg.model](cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def describe_network(model: nn.Module, cfg: TrainConfig, memory_format: torch.memory_format) -> dict:
    """The model as built for `cfg`: every layer (a module with no submodules) in the order one image passes it,
    with its type, output shape (one image's) and parameters, and the total parameter count. Read from a forward
    pass of one zero image in eval mode, without gradients: nothing in the model, nor any random stream, changes."""
    device = next(model.parameters()).device
    layers: list[dict] = []
    hooks = [
        module.register_forward_hook(
            lambda module, _, output, name=name: layers.append(
                {
                    "name": name,
                    "type": type(module).__name__,
                    "output": list(output.shape[1:]),
                    "params": sum(p.numel() for p in module.parameters()),
                }
            )
        )
        for name, module in model.named_modules()
        if not any(module.children())
    ]
    was_training = model.training
    model.eval()
    try:
        model(torch.zeros(1, 3, 32, 32, device=device).contiguous(memory_format=memory_format))
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return {
        "model": cfg.model,
        "width": cfg.width,
        "depth": cfg.depth if cfg.model == "simple_cnn" else None,
        "norm": cfg.norm,
        "layers": layers,
        "total_params": count_parameters(model),
    }
