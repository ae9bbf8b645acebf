#!/usr/bin/env bash
# make_wheels.sh [DEST]: the wheels the GPU machine's image lacks for cifar-ray , downloaded
# here (where pip reaches an index) for CPython 3.12 on Linux x86_64, Ray's slimmed below 64 MiB in all.
# DEST defaults to .whl (the repo's .gitignore already ignores /.whl/). Then copy .whl/ along with the repo to the
# GPU machine and run `bash .ci/gpu/checklist.sh` there. Nothing is installed here.
set -euo pipefail
DEST=${1:-.whl}
mkdir -p "$DEST"
PY=${PYTHON:-python3}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# ray[train,tune,client]==2.60.0's and pydantic's needs that the image (KINDS.md, 2026-11-17) does not list, at the
# versions this project was tested with
PINS=(ray==2.60.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
      rpds-py==2026.9.1 tensorboardX==2.6.5)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d "$DEST" "${PINS[@]}"

# Ray without its Java worker jar (ray/jars/, ~33 MiB): ray/_private/services.py starts Java workers only when
# that folder exists (and `java` is on PATH); Python workers never read it.
"$PY" - "$DEST" <<'EOF'
import sys, zipfile
from pathlib import Path
dest = Path(sys.argv[1])
for wheel in dest.glob("ray-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as new:
        for item in old.infolist():
            if item.filename.startswith("ray/jars/"):
                continue
            data = old.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(b"ray/jars/"))
            new.writestr(item, data)
    before, after = wheel.stat().st_size, slim.stat().st_size
    slim.replace(wheel)
    print(f"{wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB without ray/jars/")
EOF
ls -l "$DEST"
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total $((total / 1024 / 1024)) MiB in $DEST (at most 64 MiB can be copied along with the repo)"
