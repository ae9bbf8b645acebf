"""The one typed configuration of a training run, and strict parsing of user overrides (their YAML: strict_yaml.py).

Every key is flat, documented and validated here; the CLI, sweep files and the training loop all
read this class. Errors are `ConfigError`s with one line naming the key and what is allowed.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .datasets import DATASET_SIZES
from .errors import ConfigError, YamlValueError
from .strict_yaml import parse_value
from .text import shown


def default_data_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cifar-ray", "data")


Dataset = Literal["cifar10", "synthetic"]
Augment = Literal["none", "flip", "flip_crop", "flip_crop_cutout"]
ModelName = Literal["simple_cnn", "resnet9"]
Norm = Literal["batch", "group", "layer", "instance", "none"]
Optimizer = Literal["sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "lars"]
Scheduler = Literal["constant", "cosine", "onecycle", "step"]
TriState = Literal["auto", "true", "false"]
Backend = Literal["auto", "nccl", "gloo"]
Strategy = Literal["ddp", "dp", "single"]
Amp = Literal["off", "fp16", "bf16"]
GradCompression = Literal["none", "fp16", "bf16", "powersgd"]
LrScaling = Literal["none", "linear", "sqrt"]

# The largest seed and epoch count: training's data.py and distributed.py derive per-epoch and per-rank seeds from
# them, up to about seed x 1e8 + epoch x 1e3 + rank, and torch's generators take seeds below 2**64 only.
SEED_MAX = 2**32 - 1
EPOCHS_MAX = 10**6
# norm=group puts this many channels in each group (at least one group): models.NORMS builds it.
GROUP_NORM_CHANNELS = 8
WIDTH_MAX = 1024


def group_norm_groups(channels: int) -> int:
    """The number of groups norm=group splits a layer of `channels` channels into."""
    return max(1, channels // GROUP_NORM_CHANNELS)


def normalised_channels(model: str, width: int, depth: int) -> list[int]:
    """The channel counts of the normalised layers models.py builds for `model` at `width` (and `depth`)."""
    if model == "resnet9":
        return [width, 2 * width, 4 * width, 8 * width]
    return [width * 2**block for block in range(depth)]


def group_norm_builds(model: str, width: int, depth: int) -> bool:
    """Whether every normalised layer's channels split evenly into norm=group's groups."""
    return all(channels % group_norm_groups(channels) == 0 for channels in normalised_channels(model, width, depth))


class TrainConfig(BaseModel):
    """One training run. `batch_size` is the global micro-batch of one forward/backward step."""

    # inf and nan are refused for every float key: they pass the bounds (lr > 0) and fail only in training.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    # --- data
    dataset: Dataset = Field(
        "cifar10",
        description="cifar10 (downloaded into data_dir once) or synthetic "
        "(generated offline: learnable CIFAR-shaped images of 10 classes)",
    )
    data_dir: str = Field(
        default_factory=default_data_dir,
        description="folder holding (or receiving) cifar-10-batches-py; "
        "the default is under $XDG_CACHE_HOME when that is set",
    )
    train_subset: int = Field(0, ge=0, description="train on the first N training images (0 = all: 50000)")
    test_subset: int = Field(0, ge=0, description="evaluate on the first N test images (0 = all: 10000)")
    train_eval_size: int = Field(
        5000,
        ge=0,
        description="training images evaluated each epoch like the test set "
        "(eval mode, no augmentation): the first N, capped at the training set, for a "
        "like-for-like train/test gap; 0 = off",
    )
    augment: Augment = Field(
        "flip_crop",
        description="batched on-device augmentation of training images: none, flip (random horizontal flip), "
        "flip_crop (flip, then reflect-pad 4 px and a random 32x32 crop), "
        "flip_crop_cutout (flip_crop, then a random 12x12 square set to the mean)",
    )
    # --- model
    model: ModelName = Field(
        "simple_cnn",
        description="simple_cnn (assignment-style blocks of conv-norm-ReLU x 2 and max-pool, then an MLP head) "
        "or resnet9 (airbench-style residual net)",
    )
    width: int = Field(
        32,
        ge=1,
        le=WIDTH_MAX,
        description="channels of the first block; each later block (resnet9: stage) doubles them",
    )
    depth: int = Field(
        3, ge=1, le=5, description="simple_cnn only: number of blocks (each halves the resolution); resnet9 ignores it"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability before the classifier layers")
    norm: Norm = Field(
        "batch",
        description="normalisation layer after each conv: batch, group (8 channels per group: every layer's "
        "channels must split evenly, as they do for a width that is a multiple of 8), "
        "layer (one group of all channels), instance, none",
    )
    # --- optimisation
    epochs: int = Field(10, ge=1, le=EPOCHS_MAX, description="passes over the training set")
    batch_size: int = Field(
        128, ge=1, description="GLOBAL micro-batch of one forward/backward step, split evenly across workers"
    )
    accum_steps: int = Field(
        1, ge=1, description="micro-batches per optimizer step; effective batch = batch_size x accum_steps"
    )
    optimizer: Optimizer = Field(
        "momentum",
        description="sgd (no momentum), momentum (SGD + momentum), nesterov, adam, adamw, rmsprop (no momentum), "
        "lars (layer-wise adaptive rate scaling, You et al. 2017)",
    )
    lr: float = Field(0.05, gt=0.0, description="peak learning rate (at base_batch when lr_scaling is linear or sqrt)")
    lr_scaling: LrScaling = Field(
        "none",
        description="scale the peak LR with the effective batch: none, "
        "linear (lr x effective_batch / base_batch, Goyal et al. 2017), sqrt (lr x the square root of that ratio)",
    )
    base_batch: int = Field(256, ge=1, description="effective batch at which lr is the peak LR, for lr_scaling")
    lars_eta: float = Field(
        0.001,
        gt=0.0,
        description="LARS trust coefficient eta: a layer's step is about lr x eta x its weight norm, "
        "so LARS wants lr of order 1-10",
    )
    momentum: float = Field(
        0.9,
        ge=0.0,
        lt=1.0,
        description="momentum of momentum, nesterov and lars; beta1 of adam and adamw; unused by sgd and rmsprop",
    )
    weight_decay: float = Field(
        5e-4,
        ge=0.0,
        description="L2 penalty (decoupled for adamw; lars leaves biases and norm parameters undecayed)",
    )
    scheduler: Scheduler = Field(
        "cosine",
        description="LR schedule after warm-up: constant, cosine (down to 0), "
        "onecycle (linear from 0.1 x peak up to the peak at 25%, then linear down to 0), "
        "step (x 0.1 at 50% and again at 75%)",
    )
    warmup_epochs: float = Field(0.0, ge=0.0, description="linear LR warm-up from 0, in epochs (may be fractional)")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="cross-entropy label smoothing")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seeds weights, data order, augmentation and dropout")
    # --- distribution
    workers: int = Field(1, ge=1, description="Ray Train workers (ddp: processes; dp: GPUs of the one worker)")
    cpus_per_worker: int = Field(1, ge=1, description="CPU cores reserved per worker; also its torch thread count")
    compile: bool = Field(
        False, description="torch.compile the model (faster steps after a one-off compile of tens of seconds)"
    )
    use_gpu: TriState = Field("auto", description="auto (GPUs if the cluster has any), true, false")
    backend: Backend = Field(
        "auto", description="torch.distributed backend: auto (nccl with GPUs, else gloo), nccl, gloo"
    )
    gpus_per_worker: float = Field(
        1.0,
        gt=0,
        le=1,
        description="GPUs per Ray Train worker with use_gpu: 1, or a "
        "fraction to share a GPU (0.25: four 1-worker trials per GPU; several workers of "
        "one trial then need backend=gloo)",
    )
    strategy: Strategy = Field(
        "ddp", description="ddp (DistributedDataParallel), dp (one process, nn.DataParallel), single (one process)"
    )
    amp: Amp = Field("off", description="mixed precision: off, fp16 (CUDA, with GradScaler), bf16 (CUDA or CPU)")
    # --- DDP communication (used only where DDP runs: strategy=ddp with workers > 1)
    grad_compression: GradCompression = Field(
        "none",
        description="DDP gradient all-reduce compression hook: none (fp32), fp16, bf16 (cast to 16 bits; "
        "bf16 needs a torch build with CUDA and NCCL), powersgd (rank-r low-rank + error feedback); "
        "needs strategy=ddp and workers > 1",
    )
    powersgd_rank: int = Field(
        2,
        ge=1,
        le=64,
        description="PowerSGD matrix approximation rank r: an n x m gradient is sent as (n + m) x r numbers",
    )
    powersgd_start_iter: int = Field(
        2,
        ge=2,
        description="PowerSGD warm-up: plain fp32 all-reduce for the first N optimizer steps (torch needs >= 2)",
    )
    bucket_cap_mb: float = Field(
        25.0,
        gt=0.0,
        description="DDP gradient bucket size in MiB (each full bucket is all-reduced while backward goes on)",
    )
    gradient_as_bucket_view: bool = Field(
        False, description="DDP: gradients are views into the all-reduce buckets (saves one gradient copy of memory)"
    )
    static_graph: bool = Field(
        False, description="DDP static_graph optimisation (same used parameters every step); not with accum_steps > 1"
    )
    # --- reliability
    keep_checkpoints: int = Field(2, ge=1, description="per-epoch checkpoints kept per trial (the newest)")
    max_failures: int = Field(
        2, ge=0, description="worker-group restarts from the last checkpoint before a trial fails"
    )

    @field_validator("use_gpu", mode="before")
    @classmethod
    def _bool_to_tristate(cls, value: Any) -> Any:
        # YAML and JSON give real booleans; the key's values are the strings auto/true/false.
        return str(value).lower() if isinstance(value, bool) else value

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true for 1 and "64" for 64 in an int or float key: `epochs: true` would run one epoch, and a
        # quoted number reads as text everywhere else in a sweep file.
        if cls.model_fields[info.field_name].annotation in (int, float):
            if isinstance(value, bool):
                raise ValueError("true or false is not a number")
            if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", value.strip()):
                raise ValueError("a number in quotes is text: write it without quotes")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        if self.strategy == "single" and self.workers != 1:
            raise ValueError(
                f"strategy=single runs one process: workers must be 1 (got {self.workers}); use strategy=ddp or dp"
            )
        if self.strategy == "ddp" and self.batch_size % self.workers:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by workers={self.workers} "
                "(each worker gets batch_size/workers)"
            )
        if self.use_gpu == "false":
            if self.backend == "nccl":
                raise ValueError("backend=nccl needs GPUs but use_gpu=false; use backend=gloo or auto")
            if self.amp == "fp16":
                raise ValueError("amp=fp16 needs a GPU but use_gpu=false; use amp=bf16 on CPU")
            if self.strategy == "dp" and self.workers > 1:
                raise ValueError("strategy=dp splits batches over GPUs but use_gpu=false; use strategy=ddp on CPU")
        if self.strategy == "dp" and self.gpus_per_worker != 1:
            raise ValueError(
                f"strategy=dp drives `workers` whole GPUs from one process: gpus_per_worker must be 1 "
                f"(got {self.gpus_per_worker:g}); use strategy=ddp or single to share GPUs"
            )
        if self.compile and self.strategy == "dp":
            raise ValueError(
                "compile=true with strategy=dp recompiles the model on every step (DataParallel replicates it "
                "each forward); use compile=false, or strategy=ddp"
            )
        if self.grad_compression != "none" and (self.strategy != "ddp" or self.workers < 2):
            raise ValueError(
                f"grad_compression={self.grad_compression} compresses DDP's gradient all-reduce: it needs "
                f"strategy=ddp and workers > 1 (got strategy={self.strategy}, workers={self.workers}); "
                "use grad_compression=none"
            )
        if self.static_graph and self.accum_steps > 1:
            raise ValueError(
                f"static_graph=true does not work with accum_steps={self.accum_steps} "
                "(DDP no_sync fails with a static graph); use static_graph=false"
            )
        images = self.train_images
        if images < self.effective_batch:
            subset = f"train_subset={self.train_subset}" if self.train_subset else "train_subset=0: all"
            raise ValueError(
                f"the effective batch {self.effective_batch} (batch_size x accum_steps) is larger than the "
                f"{images} training images ({self.dataset}, {subset}): not one optimizer step per epoch; "
                f"allowed: an effective batch <= {images}"
            )
        if self.norm == "group" and not group_norm_builds(self.model, self.width, self.depth):
            raise ValueError(self._group_norm_refusal())
        return self

    def _group_norm_refusal(self) -> str:
        channels = normalised_channels(self.model, self.width, self.depth)
        bad = next(c for c in channels if c % group_norm_groups(c))
        # a multiple of GROUP_NORM_CHANNELS always builds, so the nearest widths that build are this close
        below = range(self.width - 1, max(0, self.width - GROUP_NORM_CHANNELS - 1), -1)
        above = range(self.width + 1, min(WIDTH_MAX, self.width + GROUP_NORM_CHANNELS) + 1)
        below, above = (
            next((w for w in ws if group_norm_builds(self.model, w, self.depth)), None) for ws in (below, above)
        )
        near = ", ".join(str(w) for w in (below, above) if w is not None)
        shape = f"model={self.model} width={self.width}" + (f" depth={self.depth}" if self.model != "resnet9" else "")
        return (
            f"norm=group cannot split {bad} channels into {group_norm_groups(bad)} groups of about "
            f"{GROUP_NORM_CHANNELS} ({shape} has layers of {', '.join(map(str, channels))} channels); "
            f"allowed: a width whose layers split evenly, e.g. {near} (any multiple of {GROUP_NORM_CHANNELS})"
        )

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step, over all workers and accumulation steps."""
        return self.batch_size * self.accum_steps

    @property
    def train_images(self) -> int:
        """Training images of the run: the dataset's, or the first train_subset of them."""
        full = DATASET_SIZES[self.dataset][0]
        return min(self.train_subset or full, full)

    @property
    def ray_workers(self) -> int:
        """Ray Train worker processes: dp drives all its GPUs from one process."""
        return 1 if self.strategy == "dp" else self.workers

    @property
    def per_worker_batch(self) -> int:
        return self.batch_size if self.strategy == "dp" else self.batch_size // self.workers

    def resolved(self, cluster_has_gpus: bool) -> TrainConfig:
        """`auto` values made concrete for the cluster at hand; raises ConfigError when impossible. Whether
        this torch build can run `grad_compression` is comm.check_grad_compression's question (it needs torch)."""
        use_gpu = {"auto": cluster_has_gpus, "true": True, "false": False}[self.use_gpu]
        if use_gpu and not cluster_has_gpus:
            raise ConfigError("use_gpu=true but the Ray cluster has no GPUs; use use_gpu=auto or false")
        backend = self.backend if self.backend != "auto" else ("nccl" if use_gpu else "gloo")
        if use_gpu and backend == "nccl" and self.ray_workers > 1 and self.gpus_per_worker < 1:
            # Ray fills one GPU before the next, and NCCL refuses two ranks on one GPU (ray-project/ray#48012).
            raise ConfigError(
                f"gpus_per_worker={self.gpus_per_worker:g} with workers={self.workers} and backend=nccl: "
                "two ranks of the trial could share a GPU, which NCCL refuses; use backend=gloo, or "
                "gpus_per_worker=1"
            )
        values = self.model_dump() | {"use_gpu": str(use_gpu).lower(), "backend": backend}
        return parse_config(values)


KEYS: tuple[str, ...] = tuple(TrainConfig.model_fields)


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def allowed_values(key: str) -> str:
    """Human description of what `key` accepts, for error messages."""
    field = TrainConfig.model_fields[key]
    choices = get_args(field.annotation)
    if choices and all(isinstance(choice, str) for choice in choices):
        return "one of " + ", ".join(choices)
    kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        field.annotation, str(field.annotation)
    )
    words = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}
    bounds = [
        f"{word} {_number(getattr(m, attr))}"
        for m in field.metadata
        for attr, word in words.items()
        if hasattr(m, attr)
    ]
    return " ".join([kind, " and ".join(bounds)]) if bounds else kind


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """' (did you mean 'batch_size'?)' for the known name closest to a misspelt `key`; '' when none is close."""
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_key_message(key: str, where: str = "") -> str:
    return f"{where}unknown config key {key!r}{did_you_mean(key, KEYS)}; known keys: {', '.join(KEYS)}"


def validation_line(
    error: ValidationError,
    where: str,
    unknown_key: Callable[[str], str],
    allowed: Callable[[str], str] | None = None,
) -> str:
    """The first of pydantic's errors as one line after `where`: an unknown key as `unknown_key(key)` says; a
    bad value as `KEY=VALUE: what is wrong; allowed: allowed(KEY)` (the value cut to SHOWN_MAX characters; a
    check whose own message says what is allowed keeps it), or `KEY: pydantic's message` without `allowed`; a
    missing key as `KEY is missing; allowed: ...`; a cross-field check's message as it is."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return where + unknown_key(key)
    message = first["msg"].removeprefix("Value error, ")
    if not key:  # a cross-field check (TrainConfig._check_combinations)
        return f"{where}{message}"
    if allowed is None:
        return f"{where}{key}: {message}"
    if first["type"] == "missing":
        return f"{where}{key} is missing; allowed: {allowed(key)}"
    if "allowed:" in message:  # a check of ours that names what is allowed (a run's name, a target)
        return f"{where}{key}: {message}"
    # "Input should be a valid integer, unable to parse ..." -> "should be a valid integer"
    message = "not allowed" if first["type"] == "literal_error" else message.split(",")[0].removeprefix("Input ")
    return f"{where}{key}={shown(first.get('input'))}: {message}; allowed: {allowed(key)}"


def parse_config(values: dict[str, Any], where: str = "") -> TrainConfig:
    """Validate a dict of config keys; `where` prefixes the message (e.g. a file name)."""
    try:
        return TrainConfig(**values)
    except ValidationError as error:
        raise ConfigError(validation_line(error, where, unknown_key_message, allowed_values)) from None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["lr=0.1", "workers=2"]` -> {"lr": 0.1, "workers": 2}; unknown keys are rejected."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in KEYS:
            raise ConfigError(unknown_key_message(key, "--set: "))
        if key in overrides:  # the last would win silently
            raise ConfigError(f"--set: {key} is given twice; allowed: each key once")
        try:
            overrides[key] = parse_value(text.strip())
        except YamlValueError as error:
            raise ConfigError(f"--set: {key}: {error}") from None
    return overrides


# Config overrides: {"epochs": 1} from Python, or ["epochs=1"] as --set takes them.
Overrides = Mapping[str, Any] | Sequence[str] | None


def override_values(overrides: Overrides) -> dict[str, Any]:
    """Overrides as a dict of config keys (a list of KEY=VALUE strings read as --set reads them)."""
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    if isinstance(overrides, str):  # a lone "KEY=VALUE" would otherwise be read letter by letter
        raise ConfigError(f"overrides are a dict or a list of KEY=VALUE strings, got the string {overrides!r}")
    return parse_overrides(list(overrides))


def absolute_paths(values: dict[str, Any]) -> dict[str, Any]:
    """Ray workers run in their own working directory: make path keys absolute on the driver."""
    if "data_dir" in values:
        values = values | {"data_dir": str(Path(values["data_dir"]).expanduser().resolve())}
    return values
