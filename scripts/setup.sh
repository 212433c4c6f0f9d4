#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment in .venv, the CPU
# build of torch 2.13.0 from local disk (installed first and by exact version so
# that nothing pulls a multi-GB CUDA build), then this package with test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
    python -m pip install -q --upgrade pip 2>/dev/null || true
    python -m pip install -q torch==2.13.0
    python -m pip install -q -e '.[test]'
    touch "$stamp"
fi
# Build (or load from cache) the CPU C++ kernels once, so the first run is not slowed by it.
python -c "from cuda_ext import ops; print(f'kernels: {ops.backend}')" >&2 || true
