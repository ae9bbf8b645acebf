"""cifar-ray's CUDA paths exercised in-process, without Ray (.ci/gpu/checklist.sh step `probe`).

Run from the repo root: python3 .ci/gpu/probe.py OUT_JSON [--inproc-checks] [--device cpu]
One line `PROBE {name: {...}}` per check on stdout; all of them in OUT_JSON, rewritten after every check, so a
probe killed by its time limit still leaves what it measured. `--device cpu` is a smoke test of this script on a
machine without a GPU (the CUDA-only checks then say so); `--inproc-checks` also runs the in-process checks of
`cifar-ray check` first, with torch's default CUDA flags, as `cifar-ray check`'s own process has them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from pathlib import Path

RESULTS: dict = {}


def record(name: str, fn, out_json: Path) -> None:
    started = time.perf_counter()
    try:
        value = fn()
        entry = {"status": "ok", **(value if isinstance(value, dict) else {"value": value})}
    except Exception as error:  # a failing check is a finding, never the end of the probe
        text = str(error).strip().splitlines()
        entry = {
            "status": "error",
            "error": f"{type(error).__name__}: {text[0][:300] if text else ''}",
            "trace": traceback.format_exc()[-2500:],
        }
    entry["seconds"] = round(time.perf_counter() - started, 2)
    RESULTS[name] = entry
    print("PROBE", json.dumps({name: entry}, default=str)[:3000], flush=True)
    out_json.write_text(json.dumps(RESULTS, indent=1, default=str))


def config(**keys):
    from cifar_ray.training.check_runs import make_config

    return make_config(**keys)


def gpu_keys(dev) -> dict:
    return {"use_gpu": "true", "backend": "nccl"} if dev.type == "cuda" else {"use_gpu": "false", "backend": "gloo"}


# ------------------------------------------------------------------------------------------------ the checks


def check_env(dev):
    import torch

    from cifar_ray.core import provenance

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gcc": shutil.which("gcc") or shutil.which("cc"),
        "python_h": os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    }
    try:
        import ray

        info["ray"] = ray.__version__
    except Exception as error:
        info["ray"] = f"not importable: {type(error).__name__}: {error}"
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info |= {
            "device": torch.cuda.get_device_name(dev),
            "capability": list(torch.cuda.get_device_capability(dev)),
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "uuid": str(props.uuid),
            "bf16_supported": torch.cuda.is_bf16_supported(),
            "cudnn": torch.backends.cudnn.version(),
            "provenance_gpu_stack": provenance.gpu_stack(torch),  # what the sweep's driver records (nvidia-smi)
        }
    return info


def check_inproc(dev):
    """The in-process checks of `cifar-ray check`, with the trials' CUDA numerics (as cluster/checks.run_checks sets
    them before its references)."""
    from cifar_ray.training import checks, gpu

    gpu.set_cuda_numerics()

    runs = {
        "accumulation": lambda: checks.check_accumulation(dev),
        "accumulation_bn": lambda: checks.check_accumulation_batchnorm(dev),
        "strategies": lambda: checks.check_strategies(dev),
        "dp": lambda: checks.check_dp(dev, 2),
        "seeds": lambda: checks.check_seeds(dev),
        "bf16": lambda: checks.check_amp(dev, "bf16"),
        "fp16": lambda: checks.check_amp(dev, "fp16"),
        "grad_scaler": lambda: checks.check_grad_scaler(dev),
        "checkpoint": lambda: checks.check_checkpoint_round_trip(dev),
    }
    out = {}
    for name, run in runs.items():
        try:
            out[name] = run().line()
        except Exception as error:
            out[name] = f"CRASH {type(error).__name__}: {str(error)[:200]}"
    return out


def check_numerics(dev):
    import torch

    from cifar_ray.core import sysinfo
    from cifar_ray.training import gpu

    b = torch.backends
    before = {
        "matmul": b.cuda.matmul.fp32_precision,
        "cudnn": b.cudnn.fp32_precision,
        "conv": b.cudnn.conv.fp32_precision,
        "benchmark": b.cudnn.benchmark,
    }
    gpu.set_cuda_numerics()  # what every worker does (distributed.select_devices)
    try:
        legacy = b.cudnn.allow_tf32
    except RuntimeError as error:
        legacy = f"raises RuntimeError: {str(error)[:90]}"
    return {"torch_defaults_before": before, "device_info": sysinfo.device_info(dev), "legacy_cudnn_allow_tf32": legacy}


def check_mfu_probe(dev):
    """training/flops.py: the GEMM peak per amp (a worker probes once per process) and FLOPs per image."""
    import torch

    from cifar_ray.training import flops
    from cifar_ray.training.models import build_model

    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
    reserved0 = torch.cuda.memory_reserved(dev) if cuda else 0
    out = {}
    for amp in ("off", "fp16", "bf16") if cuda else ("off", "bf16"):
        started = time.perf_counter()
        peak = flops.device_peak(dev, amp)
        out[amp] = {
            "tflops": round(peak.flops_per_s / 1e12, 2),
            "source": peak.source,
            "s": round(time.perf_counter() - started, 2),
        }
    if cuda:
        # the probes' tensors must not stay in the caching allocator (issue 40.3): 0 expected
        out["reserved_mb_kept_by_probe"] = round((torch.cuda.memory_reserved(dev) - reserved0) / 2**20)
    for amp in ("off", "bf16"):  # each probe's own rate, for the record (the peak is the faster)
        dtype = flops.DTYPES[amp][0]
        out[amp]["probes_tflops"] = {name: round(rate(dev, dtype) / 1e12, 2) for name, rate in flops.PROBES.items()}
    cfg = config(width=16, depth=2, **gpu_keys(dev))
    model = build_model(cfg)
    out["flops_per_image_cpu"] = flops.training_flops_per_image(model)
    out["flops_per_image_dev"] = flops.training_flops_per_image(model.to(dev, memory_format=torch.channels_last))
    return out


def check_mfu_models(dev):
    """MFU of the bare loop (build_training, train_epoch over iterate_train) against the device's peak for simple_cnn
    and resnet9, amp off and bf16 (fp16 too on CUDA), channels_last and contiguous: at most 1 everywhere."""
    import torch

    from cifar_ray.training import data, flops, loop
    from cifar_ray.training.models import build_model

    cuda = dev.type == "cuda"
    out = {}
    images = 4096 if cuda else 256
    train = data.synthetic_cifar(images, split_seed=1).to(dev)
    for model_name, width, batch in (
        (("simple_cnn", 32, 256), ("resnet9", 64, 512)) if cuda else (("simple_cnn", 16, 64),)
    ):
        for amp in ("off", "fp16", "bf16") if cuda else ("off", "bf16"):
            for layout in ("channels_last", "contiguous"):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                cfg = config(
                    model=model_name, width=width, batch_size=batch, amp=amp, train_subset=images, **gpu_keys(dev)
                )
                model = build_model(cfg).to(dev, memory_format=fmt)
                steps = images // batch
                training = loop.build_training(cfg, model, steps, dev, 1)
                loop.train_epoch(training, data.iterate_train(train, cfg, 1, 0, 1, fmt), cfg, dev).tolist()  # warm-up
                started = time.perf_counter()
                loop.train_epoch(training, data.iterate_train(train, cfg, 2, 0, 1, fmt), cfg, dev).tolist()
                seconds = time.perf_counter() - started
                peak = flops.device_peak(dev, amp)
                rate = flops.throughput(flops.training_flops_per_image(model), steps * batch, seconds, peak.flops_per_s)
                out[f"{model_name}/{amp}/{layout}"] = {
                    "mfu": round(rate["mfu"], 4),
                    "tflops": round(rate["flops_per_s"] / 1e12, 3),
                    "images_per_s": round(steps * batch / seconds),
                    "peak_source": peak.source,
                }
                del training, model
    return out


def check_train(dev):
    """loop.py on the device: channels_last weights and inputs, amp off/fp16/bf16, batch and group norm, the phase
    timer (CUDA events), peak memory above the trial's start, evaluation."""
    import torch

    from cifar_ray.training import data, loop, memory
    from cifar_ray.training.models import build_model

    cuda = dev.type == "cuda"
    out = {}
    for amp in ("off", "fp16", "bf16") if cuda else ("off", "bf16"):
        for norm in ("batch", "group"):
            cfg = config(
                amp=amp,
                norm=norm,
                width=16,
                depth=2,
                batch_size=128,
                train_subset=2048,
                test_subset=512,
                augment="flip_crop",
                dropout=0.1,
                epochs=2,
                **gpu_keys(dev),
            )
            devices = [dev]
            memory.release_trial(devices)
            at_start = memory.resident_memory_mb(devices)
            torch.manual_seed(0)
            train, test = (split.to(dev) for split in data.load_splits(cfg))
            model = build_model(cfg).to(dev, memory_format=loop.MEMORY_FORMAT)
            steps = len(train) // cfg.effective_batch
            training = loop.build_training(cfg, model, steps, dev, 1)
            seen = []
            hook = model.register_forward_pre_hook(
                lambda _, args, seen=seen: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
            )
            epochs = []
            for epoch in (1, 2):
                memory.reset_peak_memory(devices)
                timer = loop.PhaseTimer(dev)
                started = time.perf_counter()
                totals = loop.train_epoch(
                    training, data.iterate_train(train, cfg, epoch, 0, 1, loop.MEMORY_FORMAT), cfg, dev, timer
                )
                phases = timer.seconds()
                wall = time.perf_counter() - started
                evaluated = loop.evaluate(model, test, cfg, dev, 0, 1).tolist()
                peak, total, reserved, above = memory.reduce_peak_memory(devices, at_start)
                loss_sum, correct, samples, skipped = totals.tolist()
                epochs.append(
                    {
                        "loss": round(loss_sum / samples, 4),
                        "train_acc": round(correct / samples, 3),
                        "test_acc": round(evaluated[1] / evaluated[2], 3),
                        "skipped": int(skipped),
                        "wall_s": round(wall, 3),
                        "phases_s": {k: round(v, 4) for k, v in phases.items()},
                        "phases_sum_over_wall": round(sum(phases.values()) / wall, 2),
                        "peak_mb": round(peak, 1),
                        "reserved_mb": None if reserved is None else round(reserved, 1),
                        "above_start_mb": round(above, 1),
                    }
                )
            hook.remove()
            out[f"{amp}/{norm}"] = {
                "weights_channels_last": all(
                    p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4
                ),
                "inputs_channels_last": bool(seen) and all(seen),
                "optimizer_fused": training.optimizer.defaults.get("fused"),
                "at_start_mb": [round(x, 1) for x in at_start],
                "epochs": epochs,
            }
            del training, model, train, test
    return out


def check_host_sync(dev):
    """tests/test_training_paths.py::test_an_epoch_makes_no_host_sync_on_cuda, in warn mode: where each sync is."""
    import torch

    if dev.type != "cuda":
        return {"skipped": "needs CUDA"}
    from cifar_ray.training import data, loop
    from cifar_ray.training.models import build_model

    cfg = config(augment="flip_crop_cutout", batch_size=32, dropout=0.1, **gpu_keys(dev))
    split = data.synthetic_cifar(256, split_seed=1).to(dev)
    model = build_model(cfg).to(dev, memory_format=torch.channels_last)
    training = loop.build_training(cfg, model, 8, dev, 1)
    list(data.iterate_train(split, cfg, 1, 0, 1, torch.channels_last))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop.train_epoch(training, data.iterate_train(split, cfg, 2, 0, 1, torch.channels_last), cfg, dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return {"syncs": len(syncs), "where": sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})[:6]}


def check_profiler(dev):
    """training/profile.py on the device: the summary the report reads, and how its self-time total compares with
    the kernels' own time (torch's table counts device-typed, non-annotation events only)."""
    import torch
    from torch.autograd import DeviceType

    from cifar_ray.training import data, loop
    from cifar_ray.training import profile as profiling
    from cifar_ray.training.models import build_model

    cfg = config(batch_size=64, train_subset=1024, width=16, **gpu_keys(dev))
    train = data.synthetic_cifar(1024, split_seed=1).to(dev)
    model = build_model(cfg).to(dev, memory_format=torch.channels_last)
    training = loop.build_training(cfg, model, 16, dev, 1)
    with tempfile.TemporaryDirectory() as folder:
        steps = profiling.profiled_steps(
            data.iterate_train(train, cfg, 1, 0, 1, torch.channels_last), 16, folder, dev, 1
        )
        loop.train_epoch(training, steps, cfg, dev)
        summary = json.loads((Path(folder) / "profile.json").read_text())
        trace_mb = (Path(folder) / "profile_trace.json").stat().st_size / 2**20
    total = summary.get("self_s_all") or 0.0
    top = [(op["name"][:70], round(op["self_s"] / total, 3) if total else None) for op in summary["operators"][:8]]
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        loop.train_epoch(
            training, itertools.islice(data.iterate_train(train, cfg, 2, 0, 1, torch.channels_last), 3), cfg, dev
        )
    averages = prof.key_averages()
    device_events = [e for e in averages if e.device_type != DeviceType.CPU]
    kernels = sum(e.self_device_time_total for e in device_events if not getattr(e, "is_user_annotation", False))
    annotations = sum(e.self_device_time_total for e in device_events if getattr(e, "is_user_annotation", False))
    cpu_ops = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CPU)
    mine = profiling.operator_summary(averages, dev, 2, (0, 0, 3))
    return {
        "time": summary.get("time"),
        "steps": summary.get("steps"),
        "top_by_share": top,
        "profilerstep_among_operators": any(op["name"].startswith("ProfilerStep") for op in summary["operators"]),
        "trace_mb": round(trace_mb, 2),
        "same_3_steps": {
            "summary_self_s_all": round(mine["self_s_all"], 5),
            "kernels_only_s": round(kernels / 1e6, 5),
            "cpu_ops_self_device_s": round(cpu_ops / 1e6, 5),
            "gpu_annotations_s": round(annotations / 1e6, 5),
            "summary_over_kernels": round(mine["self_s_all"] / (kernels / 1e6), 2) if kernels else None,
        },
    }


def check_estimate(dev):
    """training/step_time.py (sweep --estimate) on the device, and what the driver keeps reserved afterwards."""
    import torch

    from cifar_ray.training.step_time import time_step

    out = {}
    for amp in ("off", "bf16"):
        cfg = config(amp=amp, batch_size=128, width=16, train_subset=2048, test_subset=512, **gpu_keys(dev))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        reserved0 = torch.cuda.memory_reserved() if dev.type == "cuda" else 0
        timing = time_step(cfg)
        out[amp] = {
            "step_ms": round(timing.step_s * 1e3, 3),
            "eval_us_per_image": round(timing.eval_image_s * 1e6, 3),
            "first_step_extra_s": round(timing.first_step_extra_s, 3),
        }
        if dev.type == "cuda":
            out[amp]["reserved_mb_kept_in_driver"] = round((torch.cuda.memory_reserved() - reserved0) / 2**20)
    return out


def check_oom(dev):
    import torch

    if dev.type != "cuda":
        return {"skipped": "needs CUDA"}
    from cifar_ray.cluster.session import failure_status
    from cifar_ray.training.memory import GpuOutOfMemoryError, gpu_out_of_memory_is_final

    _, total = torch.cuda.mem_get_info(dev)
    try:
        with gpu_out_of_memory_is_final():
            torch.empty(int(total * 2), dtype=torch.uint8, device=dev)
    except GpuOutOfMemoryError as error:
        return {
            "raised": "GpuOutOfMemoryError",
            "cause": type(error.__cause__).__name__,
            "status": failure_status(error),
        }
    return {"raised": None}


def check_checkpoint_devices(dev):
    """A CPU checkpoint (contiguous Adam buffers, unfused) resumed on the device (channels_last, fused on CUDA)."""
    import torch

    from cifar_ray.training import loop
    from cifar_ray.training import state as checkpoints
    from cifar_ray.training.models import build_model

    cpu = torch.device("cpu")
    cfg_cpu = config(optimizer="adam", use_gpu="false", backend="gloo")
    model = build_model(cfg_cpu)
    saved = loop.build_training(cfg_cpu, model, 4, cpu, 1)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    saved.optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        checkpoints.save_checkpoint(Path(folder), 1, saved)
        cfg = config(optimizer="adam", **gpu_keys(dev))
        resumed_model = build_model(cfg).to(dev, memory_format=torch.channels_last)
        resumed = loop.build_training(cfg, resumed_model, 4, dev, 1)
        fused_before = resumed.optimizer.param_groups[0].get("fused")
        checkpoints.load_checkpoint(Path(folder), resumed, dev)
        fused_after = resumed.optimizer.param_groups[0].get("fused")
        for param in resumed_model.parameters():
            param.grad = torch.ones_like(param)
        resumed.optimizer.step()
        buffers = [
            (p, v)
            for p in resumed_model.parameters()
            for v in resumed.optimizer.state[p].values()
            if torch.is_tensor(v) and v.shape == p.shape
        ]
        return {
            "fused_before_load": fused_before,
            "fused_after_load": fused_after,
            "state_on_device": all(v.device == dev or (dev.type == "cuda" and v.is_cuda) for _, v in buffers),
            "strides_match": all(v.stride() == p.stride() for p, v in buffers),
            "step_after_resume_ran": True,
        }


def _ddp_rank(rank: int, world: int, store: str, out_dir: str, backend: str, compression: str) -> None:
    """One rank of the Ray-free DDP check: DDP on CUDA (2 gloo ranks sharing GPU 0, or nccl on 2 GPUs)."""
    result: dict = {"rank": rank}
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(2)
        dev = torch.device("cuda", rank if backend == "nccl" else 0)
        torch.cuda.set_device(dev)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
        from cifar_ray.training import comm, data, distributed, gpu, loop, timing
        from cifar_ray.training import state as checkpoints
        from cifar_ray.training.models import build_model

        gpu.set_cuda_numerics()
        cfg = config(
            use_gpu="true",
            backend=backend,
            workers=world,
            gpus_per_worker=1.0 if backend == "nccl" else 0.5,
            grad_compression=compression,
            batch_size=128,
            train_subset=2048,
            width=16,
            depth=2,
            norm="batch",
            epochs=3,
            amp="fp16" if compression == "powersgd" else "off",
        )
        torch.manual_seed(cfg.seed)
        train = data.synthetic_cifar(2048, split_seed=1).to(dev)
        steps = len(train) // cfg.effective_batch
        model = build_model(cfg).to(dev, memory_format=loop.MEMORY_FORMAT)
        training = loop.build_training(cfg, model, steps, dev, world, rank=rank)
        result["wrapper"] = type(training.model).__name__
        epochs = []
        for epoch in (1, 2):
            timer = timing.PhaseTimer(dev)
            totals = distributed.reduce_train_totals(
                loop.train_epoch(
                    training, data.iterate_train(train, cfg, epoch, rank, world, loop.MEMORY_FORMAT), cfg, dev, timer
                )
            )
            phases = timer.seconds()
            waited, measured = timing.allreduce_wait(training.model, steps)
            breakdown = timing.reduce_time_breakdown(phases, waited, 0.0, world, dev, measured)
            stats = training.model._get_ddp_logging_data()
            keys = (
                "avg_backward_comm_time",
                "avg_backward_compute_comm_overlap_time",
                "avg_backward_compute_time",
                "backward_comm_time",
                "backward_compute_comm_overlap_time",
                "iteration",
                "backend_name",
                "comm_hook",
            )
            loss_sum, _, samples, skipped = totals.tolist()
            epochs.append(
                {
                    "loss": loss_sum / samples,
                    "skipped": int(skipped),
                    "breakdown": breakdown,
                    "measured": measured,
                    "ddp_stats": {k: stats.get(k) for k in keys},
                }
            )
        result["epochs"] = epochs
        if compression == "powersgd":  # defect 1's path for real: PowerSGD state saved, resumed on CUDA
            comm_states = comm.gather_hook_state(comm.hook_state(training.model), dev)
            rng_states = comm.gather_on_rank0(checkpoints.rng_state(dev), dev)
            folder = Path(out_dir) / "checkpoint"
            if rank == 0:
                folder.mkdir(exist_ok=True)
                checkpoints.save_checkpoint(folder, 2, training, comm_states, rng_states)
            distributed.barrier()
            fresh_model = build_model(cfg).to(dev, memory_format=loop.MEMORY_FORMAT)
            fresh = loop.build_training(cfg, fresh_model, steps, dev, world, rank=rank)
            epoch = checkpoints.load_checkpoint(folder, fresh, dev, rank, world, cfg.seed, [dev])
            state = comm.hook_state(fresh.model)
            loop.train_epoch(fresh, data.iterate_train(train, cfg, 3, rank, world, loop.MEMORY_FORMAT), cfg, dev)
            result["resume"] = {
                "epoch": epoch,
                "powersgd_iter_restored": state.iter,
                "memories_on": sorted({str(t.device) for t in state.error_dict.values()}),
                "trained_after_resume": True,
            }
        dist.destroy_process_group()
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {str(error).strip()[:400]}"
        result["trace"] = traceback.format_exc()[-2000:]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, default=str))


def check_ddp(dev, compression: str):
    import torch
    import torch.multiprocessing as mp

    if dev.type != "cuda":
        return {"skipped": "needs CUDA"}
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    with tempfile.TemporaryDirectory() as folder:
        context = mp.get_context("spawn")
        ranks = [
            context.Process(target=_ddp_rank, args=(r, 2, f"{folder}/store", folder, backend, compression))
            for r in range(2)
        ]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + 55  # per variant: the probe's step has 170 s in all
        for process in ranks:
            process.join(max(1.0, deadline - time.monotonic()))
        hung = [p.pid for p in ranks if p.is_alive()]
        for process in ranks:
            if process.is_alive():
                process.kill()
        results = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]
    return {
        "backend": backend,
        "ranks_on": "one GPU (gloo)" if backend == "gloo" else "a GPU each",
        "hung_pids": hung,
        "ranks": results,
    }


def main() -> int:
    out_json = Path(sys.argv[1])
    device = "cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu" else "cuda"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("PROBE no CUDA device visible to torch; nothing to probe (use --device cpu for a smoke test)")
        out_json.write_text(json.dumps({"error": "no CUDA"}))
        return 4
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    record("env", lambda: check_env(dev), out_json)
    record("numerics", lambda: check_numerics(dev), out_json)  # first: torch's defaults before anything sets them
    if "--inproc-checks" in sys.argv:
        record("inproc_checks", lambda: check_inproc(dev), out_json)
    record("mfu_probe", lambda: check_mfu_probe(dev), out_json)
    record("mfu_models", lambda: check_mfu_models(dev), out_json)
    record("train_amp_channels_last", lambda: check_train(dev), out_json)
    record("host_sync", lambda: check_host_sync(dev), out_json)
    record("profiler", lambda: check_profiler(dev), out_json)
    record("estimate_step_time", lambda: check_estimate(dev), out_json)
    record("oom", lambda: check_oom(dev), out_json)
    record("checkpoint_cpu_to_device", lambda: check_checkpoint_devices(dev), out_json)
    record("ddp_cuda_plain", lambda: check_ddp(dev, "none"), out_json)
    record("ddp_cuda_powersgd_fp16_resume", lambda: check_ddp(dev, "powersgd"), out_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
