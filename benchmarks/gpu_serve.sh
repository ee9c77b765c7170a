#!/usr/bin/env bash
# The serving throughput row on a lent GPU: this release against an older commit's server, same machine, same run.
#
#   bash benchmarks/gpu_serve.sh prepare   # here, with PyPI: MiniLM, the serving wheels and the old server in gpu_assets/
#   bash benchmarks/gpu_serve.sh plan      # here: what the one call carries, and its size
#   bash benchmarks/gpu_serve.sh run       # there, in the checkout's root: writes the tables to $OUT
#
# The GPU machine has no network and lacks the serving stack (fastapi, uvicorn, pydantic), so `prepare` downloads
# their wheels for its Python (3.12), packs all-MiniLM-L6-v2 with its matrices rounded to float16 (one part of
# about 40 MiB; both servers load the same rounded base, so the comparison is fair) and copies the package of
# BASELINE (default 749ee85, the commit the serving issue measures against) from git. `run` installs the wheels
# where the image lacks them, unpacks the base, and runs benchmarks/serve_load.py at 64 mixed adapters and 16
# clients on --device cuda: this release packed, padded and as WORKERS processes (default 4: on a GPU the host's
# CPU work per request is what one process runs out of), and BASELINE's server, in rotating order, the clients
# spread over several processes so that the load generator does not set the pace. It stops after RUN_LIMIT
# seconds (default 480); the per-run lines go to $OUT/serve_load-gpu.log as they come.
set -euo pipefail
cd "$(dirname "$0")/.."

ASSETS=gpu_assets
BASELINE=${BASELINE:-749ee85}
WHEELS="fastapi uvicorn prometheus-client"
LOAD=(--adapters 64 --no-switch --clients "${CLIENTS:-16}" --client-procs "${CLIENT_PROCS:-4}" --reps "${REPS:-2}"
      --requests "${REQUESTS:-4000}" --warmup 200 --threads "${THREADS:-2}" --device "${DEVICE:-cuda}"
      --also-padded --workers "${WORKERS:-4}" --baseline-checkout "$ASSETS/serve-baseline" --baseline-name "$BASELINE")

prepare() {
    local python=${PYTHON:-python}
    local base
    base=$("$python" -c "from bitfit_hf.data.assets import minilm_path; print(minilm_path())")
    rm -rf "$ASSETS/minilm" "$ASSETS/wheels-serve" "$ASSETS/serve-baseline"
    "$python" benchmarks/carry_checkpoint.py pack "$base" "$ASSETS/minilm" --part-mib 45
    # shellcheck disable=SC2086
    "$python" -m pip download -q --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$ASSETS/wheels-serve" $WHEELS
    mkdir -p "$ASSETS/serve-baseline"
    git archive "$BASELINE" bitfit_hf model_cards recipes pyproject.toml | tar -x -C "$ASSETS/serve-baseline"
    plan
}

plan() {
    local total
    total=$(du -scm "$ASSETS/minilm" "$ASSETS/wheels-serve" "$ASSETS/serve-baseline" | tail -1 | cut -f1)
    echo "One call: carry $ASSETS/minilm $ASSETS/wheels-serve $ASSETS/serve-baseline (${total} MiB, plus the checkout);"
    echo "command: bash benchmarks/gpu_serve.sh run   (timeout_s 600)"
}

run() {
    local python=${PYTHON:-python3}
    local out=${OUT:-outputs/gpu-serve}
    mkdir -p "$out"
    if ! "$python" -c "import fastapi, uvicorn, prometheus_client" 2>/dev/null; then  # carried as wheels
        "$python" -m pip install -q --no-index --find-links "$ASSETS/wheels-serve" --no-compile --no-cache-dir \
            --target /tmp/serve-site $WHEELS
        export PYTHONPATH="/tmp/serve-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BITFIT_HF_OFFLINE=1
    [ -d /tmp/minilm-fp16 ] || "$python" benchmarks/carry_checkpoint.py unpack "$ASSETS/minilm" /tmp/minilm-fp16
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
      "$python" -c "import sys, torch, transformers, fastapi, uvicorn; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, fastapi.__version__, uvicorn.__version__, torch.cuda.is_available())"
      nproc; } > "$out/environment.txt"
    cat "$out/environment.txt"
    timeout "${RUN_LIMIT:-480}" "$python" benchmarks/serve_load.py --base /tmp/minilm-fp16 "${LOAD[@]}" \
        --json "$out/serve_load-gpu.json" --markdown "$out/serve_load-gpu.md" 2> >(tee "$out/serve_load-gpu.log" >&2)
}

case "${1:-}" in
    prepare) prepare ;;
    plan) plan ;;
    run) run ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
