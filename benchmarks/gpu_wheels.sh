#!/usr/bin/env bash
# The wheels a GPU machine without network needs to run ampcert from this checkout, downloaded
# here (where PyPI is reachable) into .whl/ (git-ignored), for Python 3.12 on manylinux x86-64.
# docs/gpus.md says how to carry and install them there.
#
# What is downloaded: ampcert's own dependencies (pyproject.toml) and the extras the evidence
# uses (torch's fp8 pairing, torchao), resolved with their dependencies as pip resolves them
# for Python 3.12 (so pydantic-core matches pydantic), then cut to what the target image
# lacks. The image's packages are read from a `pip list --format=freeze` of it when one is
# given (--have FILE); else from IMAGE_HAS below, the stock H200 image's list as read on
# 2026-11-17 (Python 3.12.3, torch 2.11.0+cu130, JAX 0.11.2, transformers 5.17, lightning
# 2.6.6): it holds numpy, scipy, pandas, matplotlib, typer, rich and wrapt, and lacks
# pydantic, cryptography, ruptures, mlperf-logging and torchao.
#
#   benchmarks/gpu_wheels.sh [--have freeze.txt] [--dest .whl]
#
# Prints each wheel kept and their total size (the device tool carries 64 MiB a call).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=.whl have=""
while [ $# -gt 0 ]; do
    case "$1" in
        --have) have=$2; shift 2 ;;
        --dest) dest=$2; shift 2 ;;
        *) echo "gpu_wheels.sh: unknown argument $1 (usage: [--have freeze.txt] [--dest DIR])" >&2; exit 2 ;;
    esac
done

IMAGE_HAS="absl-py accelerate annotated-doc attrs certifi charset-normalizer click cloudpickle contourpy cycler filelock
fonttools fsspec huggingface-hub idna jax jaxlib jinja2 joblib kiwisolver lightning lightning-utilities
markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath narwhals networkx numpy nvidia-ml-py opt-einsum optax
packaging pandas pillow pip psutil pygments pyparsing pytest pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml requests rich safetensors scikit-learn scipy setuptools shellingham six sympy
threadpoolctl torch tqdm transformers triton typer typing-extensions tzdata urllib3 wheel wrapt"
if [ -n "$have" ]; then
    IMAGE_HAS=$(sed -e 's/[=<> ;@].*//' "$have" | tr 'A-Z_.' 'a-z--')
fi

# The requirements: pyproject's dependencies, and torchao (the fp8 extra's range).
reqs=$(python3 - <<'EOF'
import re, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join([*p["dependencies"], *[r for r in p["optional-dependencies"]["fp8"] if r.startswith("torchao")]]))
EOF
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Resolved with dependencies for the target (pip needs --only-binary with a foreign platform).
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 \
    --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$tmp" $reqs 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }

mkdir -p "$dest"
kept=0
for whl in "$tmp"/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
    if ! grep -qxF "$name" <<<"$(tr ' ' '\n' <<<"$IMAGE_HAS")"; then
        cp "$whl" "$dest/"
        echo "kept $(basename "$whl")"
        kept=$((kept + 1))
    fi
done
echo "$kept wheels in $dest ($(du -ch "$dest"/*.whl | tail -1 | cut -f1) in all)"
