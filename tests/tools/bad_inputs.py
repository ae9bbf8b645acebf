"""The bad-input battery of #50: 42 hostile or mistaken inputs, each a command that must exit 2 with one stderr line,
no traceback, and write nothing; a JSON line per case (exit status, lines, wall time, peak memory) and a summary.

    python tests/tools/bad_inputs.py SCRATCH   # from the repository root, the venv active; SCRATCH: a new folder

SCRATCH needs reports/quickstart/logs (cp -r reports/quickstart/logs SCRATCH/reports/quickstart/) for the report
cases. Not a test: it measures (reports/measurements.json)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
os.chdir(out)


def f(name, text):
    (Path(name).write_text(text) if isinstance(text, str) else Path(name).write_bytes(text))
    return name


cases = []


def sweep(label, name, extra=()):
    cases.append((label, ["cifar-ray", "sweep", name, "--storage", "st", *extra]))


laughs = "name: lol\ngrid:\n  lr: [&a0 [0.1, 0.2, 0.3]]\n" + "".join(
    f"  f{i}: [&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]]\n" for i in range(1, 10)
)
sweep("alias bomb (9 x 9 deep)", f("laughs.yaml", laughs))
merge = (
    "a0: &a0 {k0: 1}\n"
    + "".join(f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 8)}], k{i}: 1}}\n" for i in range(1, 12))
    + "name: m\n"
)
sweep("merge-key bomb", f("merge.yaml", merge))
sweep("0.99 MB key", f("bigkey.yaml", "name: x\n" + "k" * 990_000 + ": 1\n"))
sweep("0.99 MB list of floats", f("biglist.yaml", "name: x\ngrid:\n  lr: [" + ", ".join(["0.1"] * 198_000) + "]\n"))
sweep(
    "0.99 MB list of strings",
    f("bigstr.yaml", "name: x\ngrid:\n  note: [" + ", ".join([f"s{i}" for i in range(120_000)]) + "]\n"),
)
sweep("1.5 MB file", f("huge.yaml", "name: x\ndescription: " + "y" * 1_500_000 + "\n"))
sweep("/dev/zero", "/dev/zero")
sweep("/dev/urandom", "/dev/urandom")
sweep("UTF-16 file", f("utf16.yaml", "name: x\n".encode("utf-16")))
sweep("binary file", f("bin.yaml", bytes(range(256)) * 4))
os.makedirs("afolder.yaml", exist_ok=True)
sweep("a folder", "afolder.yaml")
if not os.path.islink("loop.yaml"):
    os.symlink("loop.yaml", "loop.yaml")
sweep("symlink loop", "loop.yaml")
sweep("5,000-deep nesting", f("deep.yaml", "name: x\nbase: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"))
sweep("Python tag", f("tag.yaml", "name: !!python/object/apply:os.system ['true']\n"))
sweep("NaN lr", f("nan.yaml", "name: x\nbase: {lr: .nan}\n"))
sweep("inf lr", f("inf.yaml", "name: x\nbase: {lr: .inf}\n"))
sweep("1e100 epochs", f("e100.yaml", "name: x\nbase: {epochs: 1e100}\n"))
sweep("10^30 epochs", f("e30.yaml", "name: x\nbase: {epochs: 1000000000000000000000000000000}\n"))
sweep("batch 0", f("b0.yaml", "name: x\nbase: {batch_size: 0}\n"))
sweep("name with ..", f("dots.yaml", "name: ../escape\n"))
sweep("name with NUL", f("nul.yaml", 'name: "a\\0b"\n'))
sweep("300-character name", f("long.yaml", "name: " + "n" * 300 + "\n"))
sweep(
    "10,001 values", f("many.yaml", "name: x\ngrid:\n  seed_note: [" + ", ".join(str(i) for i in range(10_001)) + "]\n")
)
sweep("empty grid list", f("empty.yaml", "name: x\ngrid: {lr: []}\n"))
sweep("repeated key", f("dup.yaml", "name: x\nname: y\n"))
sweep("a list, not a mapping", f("list.yaml", "- name: x\n"))
sweep("empty file", f("nothing.yaml", ""))
sweep("repeats 10^9", f("rep.yaml", "name: x\nrepeats: 1000000000\n"))
sweep("quoted number", f("quoted.yaml", "name: x\nbase: {batch_size: '64'}\n"))
sweep("lr -0.1", f("neg.yaml", "name: x\nbase: {lr: -0.1}\n"))
sweep("unknown key", f("unk.yaml", "name: x\nbase: {lrr: 0.1}\n"))
sweep("bool as number", f("bool.yaml", "name: x\nbase: {epochs: true}\n"))
ok = f("ok.yaml", "name: ok\nbase: {dataset: synthetic, epochs: 1}\n")
cases.append(("bad flag", ["cifar-ray", "sweep", ok, "--max-concurent", "2"]))
cases.append(("--set with no =", ["cifar-ray", "sweep", ok, "--set", "lr"]))
f("afile", "x")
cases.append(("a file as storage", ["cifar-ray", "sweep", ok, "--storage", "afile"]))
cases.append(("a file as run folder (status)", ["cifar-ray", "status", "afile"]))
cases.append(("a file as run folder (report)", ["cifar-ray", "report", "afile"]))
cases.append(("report --target 85", ["cifar-ray", "report", "reports/quickstart/logs", "--target", "85"]))
cases.append(("report --format pdf", ["cifar-ray", "report", "reports/quickstart/logs", "--format", "pdf"]))
cases.append(("export to an unknown target", ["cifar-ray", "export", "afile", "--to", "wandb"]))
cases.append(("nothing to resume", ["cifar-ray", "sweep", ok, "--storage", "nowhere", "--resume"]))
cases.append(("unreachable address", ["cifar-ray", "sweep", ok, "--storage", "st", "--address", "127.0.0.1:1"]))

rows = []
for label, argv in cases:
    before = set(Path(".").rglob("*"))
    t = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t
    lines = done.stderr.strip().splitlines()
    rss_kb = int(lines[-1]) if lines and lines[-1].isdigit() else -1
    err = [line for line in lines[:-1] if not line.startswith("Command exited with non-zero status")]
    after = set(Path(".").rglob("*"))
    clean = (
        done.returncode == 2
        and len(err) == 1
        and "Traceback" not in done.stderr
        and err[0].startswith("cifar-ray: error: ")
    )
    rows.append(
        {
            "case": label,
            "rc": done.returncode,
            "lines": len(err),
            "clean": clean,
            "wall_s": round(wall, 2),
            "rss_mb": round(rss_kb / 1024),
            "wrote": sorted(str(p) for p in after - before)[:3],
            "said": (err[0] if err else done.stdout[-200:])[:200],
        }
    )
    print(json.dumps(rows[-1]), flush=True)
print(
    json.dumps(
        {
            "cases": len(rows),
            "clean": sum(r["clean"] for r in rows),
            "max_wall_s": max(r["wall_s"] for r in rows),
            "max_rss_mb": max(r["rss_mb"] for r in rows),
        }
    )
)
