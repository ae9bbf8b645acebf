"""DDP gradient communication: the knobs, compression hooks, bytes per step, PowerSGD checkpoints.

`grad_compression` picks a DDP communication hook from torch (torch.distributed.algorithms.
ddp_comm_hooks) that replaces DDP's fp32 all-reduce of each gradient bucket:

- `fp16` / `bf16`: the bucket is cast to 16 bits, all-reduced, cast back (2 bytes per parameter);
  both work with gloo on CPU (checked in tests/test_large_batch.py) and with NCCL.
- `powersgd`: PowerSGD (Vogels et al. 2019) with error feedback and warm start. Every gradient is
  viewed as an n x m matrix (n = its first dimension); it is sent as P (n x r) and Q (m x r) when
  (n + m) r x min_compression_rate < n m, else uncompressed, so 1-D tensors (biases, norm params)
  always go uncompressed. The first `powersgd_start_iter` optimizer steps use plain fp32 all-reduce.

Compression only exists where DDP does (strategy=ddp, workers > 1): config.py refuses it elsewhere.
With accumulation DDP all-reduces once per optimizer step (no_sync on the other micro-batches), and
the hooks run only then.

`timing.CommTimer` wraps whichever hook runs (torch's plain all-reduce hook for `none`) on CPU and measures, per
synchronised step, the time backward spends on gradient communication rather than on computing gradients: inside
the hooks (launching, compressing, PowerSGD's serialised waits) plus the wait after the last bucket's hook until
every bucket's future has completed (DDP's finalize waits for them before backward returns). On CUDA a future
completes when its work is enqueued, not done, so no hook is wrapped there (see training/timing.py).

`allreduce_bytes_per_step` is the payload each worker hands to all-reduce per optimizer step
(mean over the steps of an epoch), mirroring the hook; what crosses the wire depends on the
all-reduce algorithm (a ring sends 2 (W-1)/W of it per worker).

PowerSGD keeps state between steps: per-rank error-feedback memories, the P and Q warm-start
memories, its step counter and RNG. `gather_hook_state` collects every rank's state to rank 0 for
the checkpoint, `restore_hook_state` gives each rank its own back.
"""

from __future__ import annotations

import logging
import math
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from ..core.config import TrainConfig
from ..core.errors import ConfigError
from .timing import timed_comm_hook

logger = logging.getLogger(__name__)

# torch's default: a tensor is compressed only if that saves at least a factor 2.
MIN_COMPRESSION_RATE = 2.0
# PowerSGDState fields that change while training (the rest are hyperparameters from the config).
POWERSGD_STATE = (
    "rng",
    "error_dict",
    "p_memory_dict",
    "q_memory_dict",
    "iter",
    "total_numel_before_compression",
    "total_numel_after_compression",
    "next_stats_report",
)
_STATE_ATTRIBUTE = "_cifar_ray_comm_state"


def ddp_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The DistributedDataParallel knobs of the config."""
    return {
        "bucket_cap_mb": cfg.bucket_cap_mb,
        "gradient_as_bucket_view": cfg.gradient_as_bucket_view,
        "static_graph": cfg.static_graph,
    }


class PowerSGDState(powersgd.PowerSGDState):
    """torch's PowerSGDState, plus which parameters each bucket's memories belong to.

    torch keeps the error-feedback, P and Q memories per bucket index, as flat tensors in the
    bucket's parameter order. A new DDP (so every resume) starts with buckets in registration
    order and rebuilds them after its first iteration in gradient-ready order: bucket i then holds
    the same parameters in another order, or other parameters. torch's own save/load of the state
    would then add each parameter's error to another parameter's gradient, silently when the sizes
    agree. Here, when a bucket's layout changes, the memories are cut into per-parameter pieces
    (`pending`) and reassembled in the new layout, so a resumed run continues exactly."""

    def __init__(self, *args, params: list[nn.Parameter] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        params = list(params or [])
        self.param_index = {id(p): i for i, p in enumerate(params)}  # id(parameter) -> position in model.parameters()
        self.param_shapes = [tuple(p.shape) for p in params]
        self.layouts: dict[int, tuple[int, ...]] = {}  # bucket index -> parameter positions of its memories
        self.pending: dict[
            int, dict[str, torch.Tensor]
        ] = {}  # parameter position -> {"error", "q"} awaiting its bucket
        self.serialize = False  # finish each bucket's all-reduces before the next bucket's (gloo)


def _matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    numel = math.prod(shape)
    n = shape[0] if shape else 1
    return n, numel // n if n else 0


def _segments(state: PowerSGDState, layout: tuple[int, ...], side: str) -> list[tuple[int, int]]:
    """(parameter, length) of each piece of a bucket's P or Q memory, in powerSGD_hook's order:
    compressed tensors grouped by matrix shape (first appearance first), bucket order within."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for index in layout:
        n, m = _matrix(state.param_shapes[index])
        r = min(n, m, state.matrix_approximation_rank)
        if powersgd._should_compress(n, m, r, state.min_compression_rate)[0]:
            groups.setdefault((n, m), []).append((index, (n if side == "p" else m) * r))
    return [segment for group in groups.values() for segment in group]


def _unpack(state: PowerSGDState, bucket: int) -> None:
    """Move a bucket's memories into per-parameter pieces (P is scratch: recomputed each step)."""
    layout = state.layouts.pop(bucket, None)
    error, q = state.error_dict.pop(bucket, None), state.q_memory_dict.pop(bucket, None)
    state.p_memory_dict.pop(bucket, None)
    if layout is None or error is None:
        return
    sizes = [math.prod(state.param_shapes[i]) for i in layout]
    q_segments = _segments(state, layout, "q")
    if error.numel() != sum(sizes) or (q is not None and q.numel() != sum(n for _, n in q_segments)):
        return  # not this layout after all: drop rather than misassign
    for index, piece in zip(layout, error.split(sizes)):
        state.pending[index] = {"error": piece}
    if q is not None:
        for (index, _), piece in zip(q_segments, q.split([n for _, n in q_segments])):
            state.pending[index]["q"] = piece


def _pack(state: PowerSGDState, bucket: int, layout: tuple[int, ...], like: torch.Tensor) -> None:
    """Reassemble a bucket's memories from `pending` when every one of its parameters is there."""
    if not all(index in state.pending for index in layout):
        for index in layout:  # some piece is missing: this bucket starts afresh
            state.pending.pop(index, None)
        return
    pieces = {index: state.pending.pop(index) for index in layout}
    state.error_dict[bucket] = torch.cat([pieces[index]["error"] for index in layout]).to(like)
    q_segments = _segments(state, layout, "q")
    if state.warm_start and all("q" in pieces[index] for index, _ in q_segments):
        q = [pieces[index]["q"] for index, _ in q_segments]  # the hook's order, not the bucket's
        state.q_memory_dict[bucket] = torch.cat(q).to(like) if q else like.new_empty(0)
        state.p_memory_dict[bucket] = like.new_empty(sum(n for _, n in _segments(state, layout, "p")))


def _keep_memories_if_not_finite(state: PowerSGDState, index: int, before: dict[str, torch.Tensor]):
    """A `then` callback for a compressed bucket: if its all-reduced result is not finite (an fp16
    gradient overflowed on some rank; GradScaler skips this step), put the error-feedback and Q
    memories back as they were before it, or drop them if the bucket had none yet. Otherwise the
    inf/NaN would stay in the memories, every later step would overflow and be skipped, and the
    trial would "finish" untrained. The result is the same on every rank (P, Q and the uncompressed
    part are all-reduced), so all ranks decide alike."""

    def callback(future):
        result = future.value()
        # A host sync, but torch's hook has just synchronised the GPU itself (decompress)
        if not bool(torch.isfinite(result).all()):
            for name, memories in (("error", state.error_dict), ("q", state.q_memory_dict)):
                if name in before:
                    memories[index] = before[name]
                else:
                    memories.pop(index, None)
            if "q" not in before:
                state.p_memory_dict.pop(index, None)  # no P memory: the hook draws a fresh random Q
        return result

    return callback


class _CudaHidden:
    """`torch` as the CPU copy of powerSGD_hook sees it: CUDA unavailable, everything else torch's own."""

    cuda = types.SimpleNamespace(is_available=lambda: False)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


# torch's powerSGD_hook synchronises `torch.cuda.synchronize(device)` whenever CUDA is available, even for a CPU
# bucket (which then raises): CPU workers see the GPUs (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0). CPU buckets go
# through this copy of the hook, whose module globals (read by its callbacks too, in whatever thread runs
# them) hold a `torch` without CUDA; the module itself stays untouched.
_cpu_powersgd_hook = types.FunctionType(
    powersgd.powerSGD_hook.__code__, vars(powersgd) | {"torch": _CudaHidden()}, "cpu_powerSGD_hook"
)


def _guarded_powersgd_hook(state, bucket):  # no annotations: DDP compares them to real classes, not strings
    index = bucket.index()
    layout = tuple(state.param_index.get(id(p), -1) for p in bucket.parameters())
    if state.layouts.get(index, layout) != layout:  # DDP rebuilt its buckets (every new DDP does once)
        for old in list(state.layouts):
            _unpack(state, old)
    if state.pending and index not in state.error_dict:
        _pack(state, index, layout, bucket.buffer())
    state.layouts[index] = layout
    compressing = state.iter >= state.start_powerSGD_iter  # before it, torch's hook is a plain all-reduce
    before = {
        name: memories[index].clone()
        for name, memories in (("error", state.error_dict), ("q", state.q_memory_dict))
        if compressing and index in memories
    }
    hook = powersgd.powerSGD_hook if bucket.buffer().is_cuda else _cpu_powersgd_hook
    future = hook(state, bucket)
    if compressing:
        future = future.then(_keep_memories_if_not_finite(state, index, before))
    if state.serialize and not bucket.is_last():
        # gloo: the hook issues its P and Q all-reduces from callbacks of earlier ones; with two
        # buckets in flight the ranks can issue them in different orders and hang (measured:
        # bucket_cap_mb=0.01 times out). Finishing each bucket before the next keeps one order;
        # the last bucket (the only one, usually) has nothing after it and is left asynchronous.
        future.wait()
    return future


def bf16_hook_supported() -> bool:
    """torch refuses bf16_compress_hook unless the build has CUDA and NCCL >= 2.10 (or XPU and
    XCCL), whatever the backend: the CUDA builds run it with gloo on CPU, CPU-only builds cannot."""
    try:
        cuda = torch.version.cuda is not None or torch.version.hip is not None
        nccl = dist.is_available() and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
        xpu = dist.is_available() and dist.is_xccl_available() and torch.xpu.is_available()
    except (AttributeError, RuntimeError):
        return False
    return bool((cuda and nccl) or xpu)


BF16_UNSUPPORTED = (
    "grad_compression=bf16 needs a torch build with CUDA and NCCL 2.10+ (torch refuses its bf16 hook "
    "otherwise, even with gloo on CPU); use grad_compression=fp16"
)


def check_grad_compression(cfg: TrainConfig) -> None:
    """Refuse, as a ConfigError, a grad_compression this torch build cannot run: the driver asks before a
    run starts (placement.resolve_plan), register_comm_hook again on each worker."""
    if cfg.grad_compression == "bf16" and not bf16_hook_supported():
        raise ConfigError(BF16_UNSUPPORTED)


def _register(ddp: nn.parallel.DistributedDataParallel, state: Any, hook: Callable | None) -> None:
    """Register `hook` on `ddp` (None: DDP's built-in all-reduce), timed by a CommTimer where its futures tell when
    the communication ended (CPU). torch's allreduce_hook does what the built-in does (divide by the world,
    all-reduce the sum), in a hook that can be timed."""
    if any(param.is_cuda for param in ddp.module.parameters()):
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        return
    ddp.register_comm_hook(state, timed_comm_hook(ddp, hook or default_hooks.allreduce_hook))


def _stateless_hook_installer(
    hook: Callable | None,
) -> Callable[[nn.parallel.DistributedDataParallel, TrainConfig], None]:
    """Installs a stateless hook (torch's 16-bit casts; None: DDP's built-in all-reduce): nothing to keep between
    steps."""

    def install(ddp: nn.parallel.DistributedDataParallel, cfg: TrainConfig) -> None:
        _register(ddp, None, hook)  # None: the default (world) process group

    return install


def _install_powersgd(ddp: nn.parallel.DistributedDataParallel, cfg: TrainConfig) -> PowerSGDState:
    state = PowerSGDState(
        None,
        matrix_approximation_rank=cfg.powersgd_rank,
        start_powerSGD_iter=cfg.powersgd_start_iter,
        min_compression_rate=MIN_COMPRESSION_RATE,
        use_error_feedback=True,
        warm_start=True,
        random_seed=cfg.seed,
        params=list(ddp.module.parameters()),
    )
    state.serialize = dist.get_backend() == "gloo"
    _register(ddp, state, _guarded_powersgd_hook)
    setattr(ddp, _STATE_ATTRIBUTE, state)
    return state


def hook_state(model: nn.Module) -> PowerSGDState | None:
    """The PowerSGD state registered on `model` (DDP, possibly inside torch.compile), else None."""
    model = getattr(model, "_orig_mod", model)
    return model.__dict__.get(_STATE_ATTRIBUTE)


def rescale_error_feedback(model: nn.Module, factor: float) -> None:
    """GradScaler changed its scale by `factor`: PowerSGD's error feedback holds residuals of scaled
    gradients, so it is rescaled to the new scale's units (else the next step adds it `1/factor` too
    large or small). A no-op without PowerSGD."""
    state = hook_state(model)
    if state is not None:
        for error in state.error_dict.values():
            error.mul_(factor)


# --- bytes per step


def powersgd_tensor_elements(
    shape: torch.Size | tuple[int, ...], rank: int, min_compression_rate: float = MIN_COMPRESSION_RATE
) -> tuple[int, bool]:
    """(elements all-reduced, compressed?) for one gradient, as powerSGD_hook decides it."""
    numel = 1
    for size in shape:
        numel *= size
    n = shape[0] if len(shape) else 1
    m = numel // n if n else 0
    r = min(n, m, rank)
    compressed = (n + m) * r
    if compressed * min_compression_rate < n * m:
        return compressed, True
    return numel, False


class Compression(NamedTuple):
    """One grad_compression: how its hook is installed on a DDP model, and what one gradient costs."""

    # Registers the hook on a DDP model; returns the PowerSGD state, else None.
    install: Callable[[nn.parallel.DistributedDataParallel, TrainConfig], PowerSGDState | None]
    # Bytes one parameter's gradient puts into all-reduce per synchronised step (after PowerSGD's
    # warm-up), given the PowerSGD rank.
    tensor_bytes: Callable[[nn.Parameter, int], int]


COMPRESSIONS: dict[str, Compression] = {
    "none": Compression(_stateless_hook_installer(None), lambda param, rank: param.numel() * param.element_size()),
    "fp16": Compression(
        _stateless_hook_installer(default_hooks.fp16_compress_hook), lambda param, rank: param.numel() * 2
    ),
    "bf16": Compression(
        _stateless_hook_installer(default_hooks.bf16_compress_hook), lambda param, rank: param.numel() * 2
    ),
    "powersgd": Compression(
        _install_powersgd,
        lambda param, rank: powersgd_tensor_elements(param.shape, rank)[0] * param.element_size(),
    ),
}


def register_comm_hook(ddp: nn.parallel.DistributedDataParallel, cfg: TrainConfig) -> PowerSGDState | None:
    """Install the grad_compression hook on a DDP model; returns the PowerSGD state (else None)."""
    check_grad_compression(cfg)
    return COMPRESSIONS[cfg.grad_compression].install(ddp, cfg)


def gradient_bytes(model: nn.Module, compression: str, rank: int = 2) -> int:
    """Bytes all-reduced by one synchronised step of DDP with this compression (PowerSGD after warm-up)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown grad_compression {compression!r}")
    tensor_bytes = COMPRESSIONS[compression].tensor_bytes
    return sum(tensor_bytes(param, rank) for param in model.parameters() if param.requires_grad)


def allreduce_bytes_per_step(
    model: nn.Module, cfg: TrainConfig, world: int, first_step: int = 0, steps: int = 1
) -> float:
    """Mean bytes each worker all-reduces per optimizer step over steps first_step .. first_step +
    steps - 1 (0-based, counted over the whole run). 0 without DDP (one process). PowerSGD's
    first `powersgd_start_iter` steps are plain fp32 all-reduces."""
    if cfg.strategy != "ddp" or world < 2 or steps < 1:
        return 0.0
    compressed = gradient_bytes(model, cfg.grad_compression, cfg.powersgd_rank)
    if cfg.grad_compression != "powersgd":
        return float(compressed)
    plain = min(steps, max(0, cfg.powersgd_start_iter - first_step))
    return (plain * gradient_bytes(model, "none") + (steps - plain) * compressed) / steps


# --- PowerSGD state in checkpoints


def _to(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def hook_state_dict(state: PowerSGDState) -> dict[str, Any]:
    """This rank's PowerSGD state as plain CPU data (the process group is left out: it cannot be
    pickled; torch's own PowerSGDState.__getstate__ does the same, with a warning each time)."""
    saved = {name: _to(getattr(state, name), "cpu") for name in POWERSGD_STATE}
    kind, keys, position, has_gauss, cached = state.rng.get_state()
    # numpy's state as a tensor and plain numbers: checkpoints load with weights_only (no numpy objects)
    saved["rng"] = (kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached))
    return saved | {
        "layouts": dict(state.layouts),
        "pending": _to(state.pending, "cpu"),
        "matrix_approximation_rank": state.matrix_approximation_rank,
    }


def load_hook_state_dict(state: PowerSGDState, saved: dict[str, Any], device: torch.device | str = "cpu") -> None:
    for name in POWERSGD_STATE:
        if name == "rng":
            kind, keys, position, has_gauss, cached = saved["rng"]
            state.rng.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
        else:
            setattr(state, name, _to(saved[name], device))
    state.layouts = dict(saved.get("layouts", {}))
    state.pending = _to(saved.get("pending", {}), device)
    if saved.get("matrix_approximation_rank") != state.matrix_approximation_rank:
        state.p_memory_dict.clear()  # another rank: other P/Q sizes; they restart from random
        state.q_memory_dict.clear()
        state.pending = {index: {"error": piece["error"]} for index, piece in state.pending.items()}


def gather_hook_state(state: PowerSGDState | None, device: torch.device | None = None) -> list[dict[str, Any]] | None:
    """Collective (every rank calls it, state None on all or none): every rank's hook_state_dict,
    in rank order, on rank 0; None on the other ranks and without PowerSGD."""
    return None if state is None else gather_on_rank0(hook_state_dict(state), device)


def gather_on_rank0(local: Any, device: torch.device | None = None) -> list[Any] | None:
    """Collective: every rank's `local` (any picklable object), in rank order, on rank 0; None on
    the other ranks. One process: [local]."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [local]
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)  # gather_object over NCCL stages through the current device
    rank = dist.get_rank()
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(local, gathered, dst=0)
    return gathered


def restore_hook_state(
    state: PowerSGDState | None,
    saved: list[dict[str, Any]] | None,
    rank: int,
    world: int,
    device: torch.device | str = "cpu",
) -> None:
    """Give this rank its own saved state back. A checkpoint from another number of workers
    keeps the shared part (step counter, RNG, P/Q) and restarts the per-rank error feedback."""
    if state is None or not saved:
        return
    if len(saved) == world:
        load_hook_state_dict(state, saved[rank], device)
    else:
        logger.warning(
            "PowerSGD state saved by %d workers, resumed on %d: error feedback restarts at zero", len(saved), world
        )
        load_hook_state_dict(state, saved[0] | {"error_dict": {}}, device)
