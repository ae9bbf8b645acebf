#!/usr/bin/env bash
# .ci/gpu/checklist.sh: cifar-ray's GPU paths, checked in one go on a 1-GPU machine (H100) with no internet.
#
# From the repo root: `bash .ci/gpu/checklist.sh` (its probe is .ci/gpu/probe.py; the repo is the one it lives in
# unless PROJECT_DIR says otherwise). It writes into $OUT (the device machine's return folder; ./gpu-checklist-out
# when unset) at most 6 files, each well under 16 MiB, none in a folder:
#   checklist.log     everything printed, as it happens (survives a kill at the time limit)
#   summary.txt       one line per step (status, rc, seconds) and the findings extracted from the runs
#   probe.json        the Ray-free probe of the CUDA paths (MFU probe, channels_last + AMP, profiler, memory, ...)
#   sweep_summary.json, report_README.md   the tiny GPU sweep, and its `cifar-ray report`
#   results.tar.gz    every step's log, the run folder (no checkpoints, no Chrome traces), the report's PNGs
# Budget: the whole script stays under BUDGET_S seconds (default 530, under 9 min); every step is time-boxed and a
# step that would not fit is skipped and said so. Steps, in order of value (STEPS selects a subset, comma-separated):
#   env install probe sweep report check pytest estimate refusal bench fasttier
# Install: no internet. Wheels may be copied along in .whl/ (and .whl2/ ...; `bash .ci/gpu/make_wheels.sh` fetches
# them where pip reaches an index); a wheel too big for one copy (64 MiB) may come as split parts NAME.whl.part-aa,
# NAME.whl.part-ab, ... in any of those folders. With a
# torch wheel among them: `pip install --no-index --find-links WHEELS -e .` (the full, pinned set). Without: the
# machine's own torch is used, the copied wheels go to /tmp/site (--no-deps), the project is installed --no-deps
# (or put on PYTHONPATH). No torch at all, or no CUDA: said, and the script ends.
set -u -o pipefail

BUDGET_S=${BUDGET_S:-530}
RESERVE_S=20                                   # kept for packing $OUT at the end
STEPS=${STEPS:-env,install,probe,sweep,report,check,pytest,estimate,refusal,bench,fasttier}
SMOKE_CPU=${SMOKE_CPU:-0}   # 1: a smoke test of this script on a machine without a GPU (everything on CPU, shrunk)
# After a Ray step, `ray stop --force` ends what a timed-out step left (on the GPU machine every process is this
# script's). Off in SMOKE_CPU mode, where other people's Ray may run: there Ray's own fate-sharing has to do.
RAY_STOP=${RAY_STOP:-$([ "$SMOKE_CPU" = 1 ] && echo 0 || echo 1)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$PWD/gpu-checklist-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-checklist.XXXXXX)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

main() {

cd "${PROJECT_DIR:-$HERE/../..}" || { echo "no PROJECT_DIR ${PROJECT_DIR:-}"; return 2; }
if [ ! -f pyproject.toml ] || [ ! -d cifar_ray ]; then
    echo "not the cifar-ray repo root: $(pwd) (set PROJECT_DIR)"; return 2
fi
ROOT=$(pwd)
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # Ray workers inherit it: they import cifar_ray from here

want() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - SECONDS - RESERVE_S)); }
NGPU=0
HAVE_RAY=0
SKIPPED_FOR_TIME=""

# run_step NAME MAX_S MIN_S CMD...: CMD under `timeout` (min(MAX_S, budget left)), its output in $WORK/NAME.log and
# here; skipped when less than MIN_S is left. Never fatal. Sets STEP_RC.
run_step() {
    local name=$1 max=$2 min=$3; shift 3
    STEP_RC=skip
    if ! want "$name"; then say "STEP $name: skipped (not in STEPS)"; return 0; fi
    local budget; budget=$(left)
    local limit=$((max < budget ? max : budget))
    if ((limit < min)); then
        say "STEP $name: skipped (${budget}s of the budget left, needs ${min}s)"
        SKIPPED_FOR_TIME="$SKIPPED_FOR_TIME,$name"
        return 0
    fi
    echo; echo "===== $name: $* (limit ${limit}s) ====="
    local started=$SECONDS
    : >"$WORK/$name.log"
    timeout -k 15 "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null &
    local pid=$!
    tail -n +1 -f --pid="$pid" "$WORK/$name.log"
    wait "$pid"
    STEP_RC=$?
    local took=$((SECONDS - started)) what=ok
    [ "$STEP_RC" = 124 ] || [ "$STEP_RC" = 137 ] && what="TIMED OUT at ${limit}s"
    [ "$STEP_RC" != 0 ] && [ "$what" = ok ] && what="rc=$STEP_RC"
    say "STEP $name: $what (${took}s)"
    return 0
}

ray_cleanup() {  # a timed-out step can leave Ray's processes (and GPU contexts) behind
    ((HAVE_RAY)) && [ "$RAY_STOP" = 1 ] && timeout 40 "$PY" -m ray.scripts.scripts stop --force >/dev/null 2>&1
    if command -v nvidia-smi >/dev/null; then
        local apps; apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null)
        [ -n "$apps" ] && say "  GPU processes still there after cleanup: $(echo "$apps" | tr '\n' ';')"
    fi
    return 0
}

# ------------------------------------------------------------------------------------------------------ env
PY=${PYTHON:-}
for candidate in "$PY" python3 /opt/torch/.venv/bin/python3 python; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null && "$candidate" -c 'import sys' 2>/dev/null && { PY=$candidate; break; }
done
say ".ci/gpu/checklist.sh at $(date -u +%FT%TZ) in $ROOT; python: ${PY:-none}; budget ${BUDGET_S}s; steps: $STEPS"
if [ -z "$PY" ]; then say "FATAL: no python3 here"; return 3; fi
if want env; then
    echo "===== env ====="
    uname -a; nproc; free -g 2>/dev/null | head -2; df -h /tmp 2>/dev/null | tail -1
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>/dev/null
        say "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tr '\n' ';')"
    else
        say "nvidia-smi: not found"
    fi
    "$PY" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "torchvision", "triton", "ray", "pydantic", "numpy", "pandas", "pyarrow", "matplotlib", "pytest"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as error:
        print(f"  {name}: NOT importable ({type(error).__name__}: {str(error)[:120]})")
try:
    import torch
    print(f"  torch.version.cuda {torch.version.cuda}; cuda available {torch.cuda.is_available()}; "
          f"devices {torch.cuda.device_count()}")
except Exception:
    pass
EOF
fi

# ------------------------------------------------------------------------------------------------------ install
if want install; then
    echo "===== install ====="
    WHEELS=$WORK/wheels
    mkdir -p "$WHEELS"
    shopt -s nullglob
    for folder in .whl .whl[0-9]*; do
        [ -d "$folder" ] || continue
        for wheel in "$folder"/*.whl; do cp "$wheel" "$WHEELS/"; done
    done
    # split wheels: NAME.whl.part-aa, NAME.whl.part-ab, ... spread over .whl*/ folders
    for name in $(for part in .whl*/*.whl.part-*; do basename "${part%.part-*}"; done | sort -u); do
        parts=$(for part in .whl*/"$name".part-*; do echo "${part##*.part-} $part"; done | sort | cut -d' ' -f2-)
        # shellcheck disable=SC2086
        cat $parts >"$WHEELS/$name" && "$PY" -m zipfile -t "$WHEELS/$name" >/dev/null 2>&1 \
            && say "install: reassembled $name from $(echo $parts | wc -w) parts" \
            || { say "install: $name: its parts do not make a valid wheel; dropped"; rm -f "$WHEELS/$name"; }
    done
    wheels=("$WHEELS"/*.whl)
    say "install: ${#wheels[@]} wheel(s) copied along"
    if ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
        # the full pinned set was copied along: the pinned install
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" -e . && say "install: pinned set installed" \
            || say "install: pip install --no-index --find-links failed (see checklist.log)"
    else
        if ((${#wheels[@]})); then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                "${wheels[@]}" && export PYTHONPATH="$PYTHONPATH:/tmp/site" \
                && say "install: copied wheels in /tmp/site (--no-deps), the machine's torch kept" \
                || say "install: pip --target /tmp/site failed"
        fi
        if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$WORK/pip-project.log" 2>&1; then
            say "install: cifar-ray installed editable (--no-deps)"
        else
            say "install: pip install -e . failed ($(tail -1 "$WORK/pip-project.log")); cifar_ray runs from PYTHONPATH"
        fi
    fi
    shopt -u nullglob
fi
if ! "$PY" -c 'import torch' 2>/dev/null; then
    say "FATAL: torch is not importable by $PY and no torch wheel was copied along: nothing GPU can run here."
    say "       Copy the pinned wheels along (.ci/gpu/make_wheels.sh) or run on a machine with a CUDA torch."
    return 3
fi
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$NGPU" = 0 ] && [ "$SMOKE_CPU" = 1 ]; then
    say "SMOKE_CPU=1: no GPU; the steps run on CPU to test this script, not the GPU paths"
elif [ "$NGPU" = 0 ]; then
    say "FATAL: torch sees no CUDA GPU ($("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'));"
    say "       nvidia-smi's driver may be too old for this torch's CUDA (a cu130 build needs driver >= 580)."
    return 4
fi
if ! "$PY" -c 'import pydantic, cifar_ray.core.config' 2>"$WORK/import.log"; then
    say "FATAL: cifar_ray.core.config does not import ($(tail -1 "$WORK/import.log")): copy pydantic's wheels along (.ci/gpu/make_wheels.sh)"
    return 5
fi
"$PY" -c 'import ray, ray.train.torch, ray.tune' 2>"$WORK/ray-import.log" && HAVE_RAY=1
((HAVE_RAY)) || say "NOTE: Ray does not import ($(tail -1 "$WORK/ray-import.log")): only the Ray-free steps run (probe, part of pytest)"
# The GPUs a local Ray is started with come from Ray's NVML count (session._local_gpu_count), not torch's: both said.
((HAVE_RAY)) && say "GPUs a local Ray gets (NVML): $("$PY" -c 'from cifar_ray.cluster.session import local_resources as r; print(r()["GPU"])' 2>&1 | tail -1); torch sees: $NGPU"
say "torch $("$PY" -c 'import torch; print(torch.__version__)') sees $NGPU GPU(s); Ray importable: $HAVE_RAY"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.14.1") else 1)' \
    || say "NOTE: torch is not the pinned 2.14.1: results are for this torch"
CR=("$PY" -m cifar_ray.cli)

# ------------------------------------------------------------------------------------------------------ probe
PROBE=$HERE/probe.py  # beside this script
inproc=()
((HAVE_RAY)) || inproc=(--inproc-checks)
[ "$SMOKE_CPU" = 1 ] && inproc+=(--device cpu)   # without Ray, `cifar-ray check` cannot run: its in-process part here
run_step probe 170 60 "$PY" "$PROBE" "$OUT/probe.json" ${inproc[@]+"${inproc[@]}"}
if [ -f "$OUT/probe.json" ]; then
    "$PY" - "$OUT/probe.json" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
def get(*path):
    node = r
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node
for name, entry in r.items():
    if isinstance(entry, dict) and entry.get("status") == "error":
        print(f"  probe {name}: ERROR {entry.get('error')}")
mfu = get("mfu_probe") or {}
print("  probe MFU peaks (TFLOP/s):", {k: (v.get("tflops"), v.get("probes_tflops")) for k, v in mfu.items() if isinstance(v, dict) and "tflops" in v},
      "| kept reserved by the probe (MiB, 0 expected):", mfu.get("reserved_mb_kept_by_probe"))
for key, run in (get("mfu_models") or {}).items():
    if isinstance(run, dict) and "mfu" in run:
        print(f"  probe MFU {key}: {run['mfu']} ({run['tflops']} TFLOP/s, {run['images_per_s']} img/s)"
              + ("  <-- MFU above 1" if run["mfu"] > 1 else ""))
train = get("train_amp_channels_last") or {}
for key, run in train.items():
    if isinstance(run, dict) and "epochs" in run:
        last = run["epochs"][-1]
        print(f"  probe train {key}: channels_last w/in {run['weights_channels_last']}/{run['inputs_channels_last']}, "
              f"loss {last['loss']}, skipped {last['skipped']}, phases/wall {last['phases_sum_over_wall']}, "
              f"peak {last['peak_mb']} MB, reserved {last['reserved_mb']} MB, above start {last['above_start_mb']} MB")
print("  probe host syncs in an epoch:", get("host_sync"))
prof = get("profiler") or {}
print("  probe profiler: ProfilerStep among operators:", prof.get("profilerstep_among_operators"),
      "| summary total / kernel time (1.0 expected):", (prof.get("same_3_steps") or {}).get("summary_over_kernels"),
      "| top:", (prof.get("top_by_share") or [])[:3])
print("  probe estimate:", get("estimate_step_time"))
print("  probe oom:", get("oom"))
print("  probe CPU checkpoint -> GPU (fused_after_load True expected):", get("checkpoint_cpu_to_device"))
for variant in ("ddp_cuda_plain", "ddp_cuda_powersgd_fp16_resume"):
    v = get(variant) or {}
    for rank in v.get("ranks", []):
        if "error" in rank:
            print(f"  probe {variant} rank {rank['rank']}: ERROR {rank['error']}")
        else:
            last = rank["epochs"][-1]
            print(f"  probe {variant} rank {rank['rank']} ({v.get('backend')}): {rank.get('wrapper')}, "
                  f"breakdown {last['breakdown']}, ddp stats {last['ddp_stats']}, resume {rank.get('resume')}")
    if v.get("hung_pids"):
        print(f"  probe {variant}: HUNG ranks {v['hung_pids']}")
inproc = get("inproc_checks")
if inproc:
    for name, line in inproc.items():
        if name not in ("status", "seconds"):
            print("  inproc", line)
EOF
fi

# ------------------------------------------------------------------------------------------------------ sweep
SWEEP=$WORK/gpu-checklist.yaml
NCCL2=""   # with 2+ GPUs the auto layout is 2 nccl ranks on a GPU each; the shared-GPU gloo path is asked for
((NGPU >= 2)) && NCCL2="    - {workers: 2, backend: gloo, gpus_per_worker: 0.5}"
USE_GPU=true LAYOUT1="{workers: 1, backend: nccl}" AMPS="['off', fp16, bf16]"
[ "$SMOKE_CPU" = 1 ] && USE_GPU=false LAYOUT1="{workers: 1, backend: gloo, cpus_per_worker: 2}" AMPS="['off', bf16]"
cat >"$SWEEP" <<EOF
name: gpu-checklist
description: >-
  GPU checklist: 1 and 2 workers, nccl and gloo, amp off/fp16/bf16 on this machine's GPUs; synthetic data, 2 epochs.
base:
  dataset: synthetic
  train_subset: 2048
  test_subset: 512
  train_eval_size: 256
  model: simple_cnn
  width: 16
  depth: 2
  epochs: 2
  batch_size: 128
  use_gpu: $USE_GPU
  optimizer: momentum
  lr: 0.05
  max_failures: 0
grid:
  layout:
    - $LAYOUT1
    - {workers: 1, backend: gloo}
    - {workers: 2}
$NCCL2
  amp: $AMPS
EOF
RUN=$WORK/runs/gpu-checklist
if ((HAVE_RAY)); then
    run_step sweep 230 90 "${CR[@]}" sweep "$SWEEP" --storage "$WORK/runs" --profile
    ray_cleanup
    [ -d "$RUN" ] && run_step report 60 15 "${CR[@]}" report "$RUN" --out "$WORK/report"
    [ -f "$WORK/report/README.md" ] && cp "$WORK/report/README.md" "$OUT/report_README.md"
    if [ -d "$RUN" ]; then
        "$PY" - "$RUN" "$OUT/sweep_summary.json" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
from pathlib import Path
from cifar_ray.core import runlog
run = runlog.load_run(sys.argv[1])
sweep = run.sweep
out = {"wall_time_s": sweep.get("wall_time_s"), "cluster": {k: (sweep.get("cluster") or {}).get(k) for k in ("cpus", "gpus", "packing")}}
session = Path(sys.argv[1]) / "provenance" / "session-1.json"
out["provenance_gpu"] = json.loads(session.read_text()).get("gpu") if session.exists() else None
rows, first_in_slot = [], set()
for trial in sorted(run.trials, key=lambda t: t.meta.get("started_unix") or 0):
    slot = trial.meta.get("slot")
    first = slot not in first_in_slot
    first_in_slot.add(slot)
    last = trial.epochs[-1] if trial.epochs else {}
    system = trial.meta.get("system") or {}
    profile = runlog.read_json(Path(sys.argv[1]) / trial.name / runlog.PROFILE_FILE)
    total = profile.get("self_s_all") if profile else None
    rows.append({
        "trial": trial.name, "status": trial.status, "error": trial.meta.get("error"),
        "workers": trial.config.get("workers"), "backend": trial.config.get("backend"),
        "gpus_per_worker": trial.config.get("gpus_per_worker"), "amp": trial.config.get("amp"),
        "epochs": len(trial.epochs), "test_acc": last.get("test_acc"), "mfu": last.get("mfu"),
        "peak_tflops": round((last.get("peak_flops_per_s") or 0) / 1e12, 1), "peak_source": last.get("peak_source"),
        "time_allreduce_s": last.get("time_allreduce_s"), "time_allreduce_estimate_s": last.get("time_allreduce_estimate_s"),
        "peak_mem_mb": last.get("peak_mem_mb"), "peak_mem_total_mb": last.get("peak_mem_total_mb"),
        "peak_mem_reserved_mb": last.get("peak_mem_reserved_mb"), "peak_mem_above_start_mb": last.get("peak_mem_above_start_mb"),
        "first_epoch_reserved_mb": (trial.epochs[0].get("peak_mem_reserved_mb") if trial.epochs else None),
        "amp_skipped_steps": last.get("amp_skipped_steps"), "first_in_its_slot": first, "slot": slot,
        "system": {k: system.get(k) for k in ("device_name", "num_gpus", "gpu_share", "world_size", "gpu_uuids", "cuda_numerics")},
        "profile_top": [(op["name"][:60], round(op["self_s"] / total, 2)) for op in profile["operators"][:4]] if total else None,
    })
out["trials"] = rows
Path(sys.argv[2]).write_text(json.dumps(out, indent=1, default=str))
print(f"  sweep: wall {out['wall_time_s']}, cluster {out['cluster']}, provenance gpu {out['provenance_gpu']}")
for r in rows:
    flags = []
    if r["status"] != "finished": flags.append(f"STATUS {r['status']}: {r['error']}")
    if r["mfu"] is not None and not 0.0005 < r["mfu"] <= 1: flags.append("MFU out of range")
    if r["first_in_its_slot"] and (r["first_epoch_reserved_mb"] or 0) > 2 * (r["peak_mem_reserved_mb"] or 0) + 64:
        flags.append("first epoch's reserved memory far above the last's (probe left cached?)")
    if r["workers"] == 2 and r["time_allreduce_estimate_s"] is None: flags.append("no all-reduce estimate")
    if r["profile_top"] and r["profile_top"][0][0].startswith("ProfilerStep"): flags.append("profile top = ProfilerStep*")
    print(f"  trial {r['trial']}: {r['status']} w{r['workers']} {r['backend']} gpw {r['gpus_per_worker']} amp {r['amp']}: "
          f"acc {r['test_acc']}, mfu {r['mfu'] and round(r['mfu'], 4)} of {r['peak_tflops']} TF/s, "
          f"allreduce {r['time_allreduce_s']}/est {r['time_allreduce_estimate_s']}, mem {r['peak_mem_mb']}/"
          f"res {r['peak_mem_reserved_mb']} (epoch1 {r['first_epoch_reserved_mb']}, first in slot {r['first_in_its_slot']})/"
          f"above {r['peak_mem_above_start_mb']} MB, gpus {r['system']['num_gpus']} share {r['system']['gpu_share']}"
          + (f"  <-- {'; '.join(flags)}" if flags else ""))
EOF
    fi
    grep -h "ranks share GPUs" "$WORK/sweep.log" 2>/dev/null | head -2 | sed 's/^/  sweep said: /' | tee -a "$SUMMARY"
else
    say "STEP sweep/report: skipped (no Ray)"
fi

# ------------------------------------------------------------------------------------------------------ check
if ((HAVE_RAY)); then
    run_step check 240 90 "${CR[@]}" check --use-gpu "$([ "$SMOKE_CPU" = 1 ] && echo false || echo true)"
    grep -E "^(PASS|FAIL|SKIP)|passed, .* failed" "$WORK/check.log" 2>/dev/null | cut -c1-220 | sed 's/^/  check: /' | tee -a "$SUMMARY"
    ray_cleanup
else
    say "STEP check: skipped (no Ray; its in-process checks ran in the probe)"
fi

# ------------------------------------------------------------------------------------------------------ pytest
# The CUDA-only tests (skipif without CUDA), the GPU-themed CPU tests, and test_check.py, whose outcome depends on
# whether torch sees a GPU. test_check_command_passes_on_this_machine is a CPU run (--use-gpu false): left out.
if "$PY" -c 'import pytest' 2>/dev/null; then
    tests=(
        tests/test_gpu.py tests/test_gpu_sharing.py tests/test_device_state.py
        tests/test_equivalence.py::test_fp16_with_grad_scaler_stays_near_fp32_on_cuda
        tests/test_training_paths.py::test_an_epoch_makes_no_host_sync_on_cuda
        tests/test_training_paths.py::test_the_epochs_indices_reach_a_gpu_without_a_host_sync
        tests/test_flops.py
        tests/test_training_paths.py::test_peak_memory_is_the_max_over_the_workers_gpus
        tests/test_large_batch.py::test_fused_optimizer_kernels_on_cuda_only
        tests/test_large_batch.py::test_powersgd_on_cpu_tensors_never_synchronises_cuda
    )
    ((HAVE_RAY)) && tests+=(tests/test_check.py --deselect tests/test_check.py::test_check_command_passes_on_this_machine)
    run_step pytest 180 40 "$PY" -m pytest -q -rfEs -p no:cacheprovider -m "not slow" --junitxml="$WORK/pytest.xml" "${tests[@]}"
    grep -E "^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed)" "$WORK/pytest.log" 2>/dev/null | cut -c1-220 | sed 's/^/  pytest: /' | tee -a "$SUMMARY"
    ray_cleanup
else
    say "STEP pytest: skipped (pytest does not import)"
fi

# ------------------------------------------------------------------------------------------------------ estimate
if true; then  # sweep --dry-run --estimate times the steps here, without Ray
    run_step estimate 90 30 "${CR[@]}" sweep "$SWEEP" --dry-run --estimate --storage "$WORK/runs-estimate"
    grep -h "estimated wall time" "$WORK/estimate.log" 2>/dev/null | sed 's/^/  estimate: /' | tee -a "$SUMMARY"
    [ -f "$OUT/sweep_summary.json" ] && say "  the sweep itself took $("$PY" -c "import json; print(json.load(open('$OUT/sweep_summary.json'))['wall_time_s'])") s"
fi

# ------------------------------------------------------------------------------------------------------ refusal
# On one GPU, NCCL ranks cannot share it: a 2-worker nccl trial must be refused in one line (exit 2), naming the way out.
if ((HAVE_RAY)) && ((NGPU == 1)) && [ "$SMOKE_CPU" != 1 ]; then
    run_step refusal 60 25 "${CR[@]}" train --set dataset=synthetic use_gpu=true workers=2 backend=nccl epochs=1 \
        train_subset=512 test_subset=128 --storage "$WORK/runs-refusal" --name refusal
    say "  refusal: rc=$STEP_RC (expected 2): $(grep -h 'error:' "$WORK/refusal.log" 2>/dev/null | tail -1 | cut -c1-200)"
    ray_cleanup
fi

# ------------------------------------------------------------------------------------------------------ bench
# `cifar-ray bench --quick` times CPU trials only (bench_config sets use_gpu=false): run only if time is left.
if ((HAVE_RAY)); then
    run_step bench 200 150 "${CR[@]}" bench --quick --out "$WORK/bench"
    ray_cleanup
fi

# ------------------------------------------------------------------------------------------------------ fasttier
# The fast tier with CUDA visible (issue 40, item 8: every test passes on a GPU machine, or skips where a GPU
# changes the answer), last: it needs Ray and a few minutes.
if ((HAVE_RAY)) && "$PY" -c 'import pytest' 2>/dev/null; then
    run_step fasttier 420 150 "$PY" -m pytest -q -rfEs -p no:cacheprovider -m "not slow" -x --junitxml="$WORK/fasttier.xml" tests
    grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$WORK/fasttier.log" 2>/dev/null | cut -c1-220 | sed 's/^/  fasttier: /' | tee -a "$SUMMARY"
    ray_cleanup
fi

# ------------------------------------------------------------------------------------------------------ pack
say "done in ${SECONDS}s"
[ -n "$SKIPPED_FOR_TIME" ] && say "left for a second call: STEPS=env,install$SKIPPED_FOR_TIME bash .ci/gpu/checklist.sh"
tar --exclude='*.pt' --exclude='profile_trace.json' --exclude='.slots' -czf "$OUT/results.tar.gz" -C "$WORK" \
    $(cd "$WORK" && ls -d *.log *.xml *.yaml runs report bench 2>/dev/null) 2>/dev/null
size=$(stat -c %s "$OUT/results.tar.gz" 2>/dev/null || echo 0)
if ((size > 15 * 1024 * 1024)); then  # over what comes back: logs and the report only
    tar -czf "$OUT/results.tar.gz" -C "$WORK" $(cd "$WORK" && ls -d *.log *.xml report 2>/dev/null) 2>/dev/null
fi
echo; echo "===== summary ====="; cat "$SUMMARY"
return 0
}

main "$@" 2>&1 | tee "$OUT/checklist.log"
exit "${PIPESTATUS[0]}"
