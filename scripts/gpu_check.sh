#!/usr/bin/env bash
# The GPU path, proven in one run (issue 14): build the CUDA kernels for this
# GPU, run the `gpu` tests, measure paged decode bandwidth, check greedy parity
# with transformers, profile opt-1.3b and llama-3.1-8b, validate on a short
# ShareGPT trace, and compare the measured-op cost model with the engine's
# measured steps. Every step is timed and logged; a failing step is recorded
# and the run goes on. Results: --out (default reports/gpu-check/), with
# summary.json and summary.md.
#
#   bash scripts/gpu_check.sh --fetch-wheels     # here, with a registry: wheels into .whl/
#   bash scripts/gpu_check.sh [--out DIR] [--tar FILE] [--full]   # on the H200 machine
#   bash scripts/gpu_check.sh --dry-run [--out DIR]               # here: every step on the CPU
#
# On the GPU machine it uses that machine's own python3 (torch with CUDA and
# nvcc are there); the pure-Python dependencies it lacks travel as wheels in
# .whl/ and are installed with `pip install --no-index --find-links` into a
# private folder (.whl/ is git-ignored: name it in the device tool's carry).
# --tar packs the results into one file (the device tool
# returns at most 8 files). --full profiles the default grid instead of --quick.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=reports/gpu-check
DRY=0
FULL=0
TAR=""
FETCH=0
WHEELS=.whl
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --full) FULL=1; shift ;;
        --tar) TAR=$2; shift 2 ;;
        --fetch-wheels) FETCH=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# Dependencies the GPU machine's image lacks (KINDS.md lists what it has).
MISSING_PACKAGES="simpy pydantic pydantic-core annotated-types typing-inspection"

if [ "$FETCH" = 1 ]; then
    # Same versions as this checkout's environment, as CPython 3.12 x86-64 wheels.
    PY=${PYTHON:-.venv/bin/python}
    pins=$($PY - "$MISSING_PACKAGES" <<'EOF'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1].split()))
EOF
)
    mkdir -p "$WHEELS"
    # shellcheck disable=SC2086
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" $pins || exit 1
    ls "$WHEELS"
    exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/steps.tsv"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    DEVICE=cpu GPU=cpu
    export PAGED_DEVICE=cpu
else
    PY=python3
    DEVICE=cuda GPU=h200
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --find-links "$WHEELS" --target "$SCRATCH/site" \
            "$WHEELS"/*.whl || { echo "gpu_check: installing the wheels in $WHEELS failed" >&2; exit 1; }
        export PYTHONPATH="$SCRATCH/site"
    else
        echo "gpu_check: no wheels in $WHEELS (run --fetch-wheels where a registry is reachable)" >&2
    fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export PAGED_KERNELS_BUILD_DIR=${PAGED_KERNELS_BUILD_DIR:-$SCRATCH/kernels}

PLANNER=("$PY" -c 'import sys; from planner.cli.app import main; sys.argv[0] = "planner"; main()')

# step NAME TIMEOUT_S COMMAND...: run, log to NAME.log, record status and seconds.
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name" >&2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" >> "$OUT/steps.tsv"
    [ "$status" = 0 ] || { echo "   $name failed ($status); last lines:" >&2; tail -5 "$OUT/$name.log" >&2; }
    return 0
}

# Models: the catalog's on the GPU; tiny local folders of the same families in a dry run.
if [ "$DRY" = 1 ]; then
    "$PY" - "$SCRATCH" <<'EOF'
import sys
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig
torch.manual_seed(0)
for name, config in (("opt-tiny", OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                            vocab_size=256, max_position_embeddings=256, word_embed_proj_dim=64)),
                     ("llama-tiny", LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                                max_position_embeddings=256))):
    AutoModelForCausalLM.from_config(config).save_pretrained(f"{sys.argv[1]}/{name}", safe_serialization=True)
EOF
    MODELS="$SCRATCH/opt-tiny $SCRATCH/llama-tiny"
    PROFILE_GRID=(--quick --repeats 1)
    BENCH=(--batch 4 --context 256 --warmup 1 --iters 3)
    PARITY=(--new-tokens 4)
    VALIDATE=(--quick)
else
    MODELS="opt-1.3b llama-3.1-8b"
    if [ "$FULL" = 1 ]; then PROFILE_GRID=(); else PROFILE_GRID=(--quick); fi
    BENCH=()
    PARITY=()
    VALIDATE=(--requests 64 --rate 8 --length-scale 1.0 --max-output-len 256 --max-num-seqs 64)
fi

step env 60 bash -c "nvidia-smi || true; $PY -c 'import torch, sys; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\")'"
if [ "$DRY" = 1 ]; then
    step build 600 "$PY" -c "from cuda_ext import build; build.build_cpu_extension()"
else
    step build 420 "$PY" -c "from cuda_ext import build; print(build.cuda_arch()); build.build_cuda_extension()"
fi
step gpu-tests 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/ --junitxml="$OUT/gpu-tests.xml"
step decode-bandwidth 180 "$PY" bench/gpu_decode_bandwidth.py --device "$DEVICE" --out "$OUT/decode_bandwidth.json" "${BENCH[@]}"
step parity 300 "$PY" bench/gpu_parity.py --device "$DEVICE" --out "$OUT/parity.json" "${PARITY[@]}"
mkdir -p "$OUT/profiles"
for model in $MODELS; do
    name=$(basename "$model")
    step "profile-$name" 420 "${PLANNER[@]}" profile --gpu "$GPU" --model "$model" "${PROFILE_GRID[@]}" \
        --out "$OUT/profiles/$GPU-$name.json"
done
first=${MODELS%% *}
name=$(basename "$first")
step "validate-$name" 420 "${PLANNER[@]}" validate --gpu "$GPU" --model "$first" --workload sharegpt "${VALIDATE[@]}" \
    --profile "$OUT/profiles/$GPU-$name.json" --out "$OUT/validate-$name" --json
# The measured-op cost model (NVIDIA's vLLM op tables) against the same engine's measured steps.
if "${PLANNER[@]}" validate --help 2>/dev/null | grep -q -- "--cost-model"; then
    step "measured-cost-model-$name" 420 "${PLANNER[@]}" validate --gpu "$GPU" --model "$first" --workload sharegpt \
        "${VALIDATE[@]}" --cost-model measured --out "$OUT/validate-measured-$name" --json
else
    echo "the measured-op cost model is not in this build: planner validate has no --cost-model option, so it" \
         "was not compared with the engine's measured steps" > "$OUT/measured-cost-model-$name.log"
    printf '%s\t%s\t%s\n' "measured-cost-model-$name" "absent" 0 >> "$OUT/steps.tsv"
    echo "== measured-cost-model-$name: absent (planner validate has no --cost-model)" >&2
fi
"$PY" scripts/gpu_check_summary.py "$OUT" $([ "$DRY" = 1 ] && echo --dry-run)
status=$?
if [ -n "$TAR" ]; then
    tar czf "$TAR" -C "$(dirname "$OUT")" "$(basename "$OUT")"
fi
exit $status
