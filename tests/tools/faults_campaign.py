"""The faults campaign of #50: each fault on a fresh 4-trial sweep (3 epochs, one trial diverging, 2 at once) at a
random moment, then --resume until every trial has ended; every trial's metrics.jsonl and TensorBoard event files
checked (each epoch once, 1 to its last: none lost, none twice) and the processes carrying the run's mark counted.

    python tests/tools/faults_campaign.py SEED COUNT SCRATCH [KIND,KIND...]   # the venv active

A JSON line per fault. Not a test: it measures (reports/measurements.json)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from cifar_ray.cluster.live_view import logged_steps

seed, count, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rng = random.Random(seed)
KINDS = [
    "driver SIGKILL",
    "Ctrl-C",
    "SIGTERM",
    "worker SIGKILL",
    "SIGKILL + trial.json deleted",
    "SIGKILL + newest checkpoint cut",
    "SIGKILL + every checkpoint of a trial cut",
    "SIGKILL + metrics line cut",
]
if len(sys.argv) > 4:
    KINDS = [k for k in KINDS if k in sys.argv[4].split(",")]
SWEEP = """name: camp
base: {dataset: synthetic, train_subset: 512, test_subset: 128, width: 4, depth: 2, epochs: 3, batch_size: 64}
grid:
  lr: [0.05, 0.1, 0.2, 100000.0]
max_concurrent: 2
"""


def rows(run):
    found = {}
    for m in run.glob("t[0-9]*/metrics.jsonl"):
        found[m.parent.name] = [json.loads(line)["epoch"] for line in m.read_text().splitlines() if line.strip()]
    return found


def marked(mark):
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if mark.encode() in (p / "environ").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def ray_pids(mark):
    return [p for p in marked(mark) if p != os.getpid()]


results = []
for i in range(count):
    kind = KINDS[(seed + i) % len(KINDS)]
    case = out / f"f{seed}-{i}"
    case.mkdir(parents=True)
    (case / "camp.yaml").write_text(SWEEP)
    mark = f"CAMPAIGN_MARK=c{seed}x{i}x{os.getpid()}"
    env = dict(os.environ, CAMPAIGN_MARK=mark.split("=")[1])
    cmd = ["cifar-ray", "sweep", "camp.yaml", "--storage", "st"]
    log = open(case / "run0.log", "w")
    proc = subprocess.Popen(cmd, cwd=case, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run = case / "st" / "camp"
    at_rows = rng.randint(0, 7)
    t0 = time.time()
    while proc.poll() is None and sum(len(v) for v in rows(run).values()) < at_rows and time.time() - t0 < 600:
        time.sleep(0.2)
    time.sleep(rng.uniform(0, 3))
    fault_at = round(time.time() - t0, 1)
    if proc.poll() is not None:
        note = "ended before the fault"
    elif kind == "worker SIGKILL":
        workers, t1 = [], time.time()
        while not workers and proc.poll() is None and time.time() - t1 < 60:
            workers = [
                p for p in ray_pids(mark.split("=")[1]) if b"TrainWorker" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
            time.sleep(0.2)
        note = f"killed worker {workers[:1]}"
        if workers:
            os.kill(workers[0], signal.SIGKILL)
    else:
        sig = {"Ctrl-C": signal.SIGINT, "SIGTERM": signal.SIGTERM}.get(kind, signal.SIGKILL)
        os.kill(proc.pid, sig)
        note = f"sent {sig.name}"
    code0 = proc.wait(timeout=900)
    time.sleep(2)
    if kind.startswith("SIGKILL +"):
        for p in ray_pids(mark.split("=")[1]):  # the dead driver's Ray: what a user's next --resume starts anew
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        trials = sorted(run.glob("t[0-9]*"))
        if trials:
            victim = rng.choice(trials)
            if "trial.json" in kind and (victim / "trial.json").exists():
                (victim / "trial.json").unlink()
                note += f"; deleted {victim.name}/trial.json"
            elif "newest" in kind:
                ck = sorted(victim.glob("checkpoints/epoch-*/state.pt"))
                if ck:
                    ck[-1].write_bytes(ck[-1].read_bytes()[:100])
                    note += f"; cut {ck[-1].relative_to(run)}"
            elif "every" in kind:
                for ck in victim.glob("checkpoints/epoch-*/state.pt"):
                    ck.write_bytes(ck.read_bytes()[:100])
                    note += f"; cut {ck.relative_to(run)}"
            elif "metrics" in kind and (victim / "metrics.jsonl").exists():
                text = (victim / "metrics.jsonl").read_text()
                if text.strip():
                    (victim / "metrics.jsonl").write_text(text[: len(text) - 7])
                    note += f"; cut {victim.name}/metrics.jsonl"
    resumes, codes = 0, [code0]
    while resumes < 4:
        state = json.loads((run / "sweep.json").read_text()) if (run / "sweep.json").exists() else {}
        statuses = [
            json.loads((t / "trial.json").read_text()).get("status") if (t / "trial.json").exists() else None
            for t in sorted(run.glob("t[0-9]*"))
        ]
        if codes[-1] == 0 and statuses and all(s in ("finished", "diverged") for s in statuses) and len(statuses) == 4:
            break
        resumes += 1
        with open(case / f"run{resumes}.log", "w") as log:
            codes.append(
                subprocess.run(
                    cmd + ["--resume"] if (run / "sweep.json").exists() else cmd,
                    cwd=case,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ).returncode
            )
    time.sleep(10)
    left = ray_pids(mark.split("=")[1])
    final = rows(run)
    statuses = {t.name: json.loads((t / "trial.json").read_text()).get("status") for t in sorted(run.glob("t[0-9]*"))}
    lost, dup, tb_lost, tb_dup = 0, 0, 0, 0
    for name, epochs in final.items():
        last = max(epochs) if epochs else 0
        want = list(range(1, (3 if statuses[name] == "finished" else last) + 1))
        lost += len(set(want) - set(epochs))
        dup += len(epochs) - len(set(epochs))
        tb = sorted(logged_steps(run / name))
        tb_lost += len(set(epochs) - set(tb))
        tb_dup += len(tb) - len(set(tb))
    result = {
        "fault": kind,
        "seed": seed,
        "i": i,
        "at_rows": at_rows,
        "fault_at_s": fault_at,
        "note": note,
        "codes": codes,
        "resumes": resumes,
        "statuses": sorted(statuses.values()),
        "lost": lost,
        "dup": dup,
        "tb_lost": tb_lost,
        "tb_dup": tb_dup,
        "left": len(left),
    }
    print(json.dumps(result), flush=True)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
