#!/usr/bin/env bash
# The study's GPU budget, finished on a lent GPU machine: the cells docs/reproduction-gpu.md lists as not run.
#
#   bash benchmarks/gpu_finish_study.sh prepare   # here, with PyPI: rounded mpnet, data and wheels in gpu_assets/
#   bash benchmarks/gpu_finish_study.sh plan      # here: what each call to the GPU machine carries
#   bash benchmarks/gpu_finish_study.sh run       # there, in the checkout's root, once every part is there
#
# The GPU machine has no network and takes a few tens of MiB a call, so the 404 MB checkpoint travels as
# float16-rounded parts (benchmarks/carry_checkpoint.py) over several calls; parts carried earlier stay on the
# warm machine. `run` unpacks it to /tmp/mpnet-fp16 (the base every committed cell names), installs the carried
# wheels, resumes the study from the committed cell records (only pending cells run), writes the report, and
# copies cells, report and versions to $OUT. It stops the study after STUDY_LIMIT seconds (default 420) so the
# report is still written; a later call resumes the cells left.
set -euo pipefail
cd "$(dirname "$0")/.."

ASSETS=gpu_assets
PART_MIB=${PART_MIB:-27}
DATA_ASSETS="movie_reviews vitaminc wsj_pos squad_dev"
WHEELS="datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19"
STUDY=(--budget gpu --device cuda --model_name_or_path /tmp/mpnet-fp16 "--recipe_args=--tf32 True"
       --output_dir outputs/study-gpu)

prepare() {
    local cache=${BITFIT_HF_CACHE:-$HOME/.cache/bitfit_hf/assets}
    local python=${PYTHON:-python}
    for asset in mpnet $DATA_ASSETS; do
        [ -d "$cache/$asset" ] || { echo "$cache/$asset is missing: run 'bitfit-hf assets fetch $asset' first" >&2; exit 2; }
    done
    rm -rf "$ASSETS/mpnet" "$ASSETS/data" "$ASSETS/wheels-py312"
    "$python" benchmarks/carry_checkpoint.py pack "$cache/mpnet" "$ASSETS/mpnet" --part-mib "$PART_MIB"
    local staging
    staging=$(mktemp -d)
    for asset in $DATA_ASSETS; do cp -r "$cache/$asset" "$staging/"; done
    "$python" benchmarks/carry_checkpoint.py pack "$staging" "$ASSETS/data" --part-mib "$PART_MIB"
    rm -rf "$staging"
    # shellcheck disable=SC2086
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$ASSETS/wheels-py312" $WHEELS
    plan
}

plan() {
    echo "Each transfer is one call to the GPU machine, naming these paths in its carry (parts stay there between"
    echo "calls); the last call runs: bash benchmarks/gpu_finish_study.sh run"
    "${PYTHON:-python}" benchmarks/carry_checkpoint.py plan "$ASSETS/mpnet" "$ASSETS/data" \
        --with-first "$ASSETS/wheels-py312" --call-mib "${CALL_MIB:-56}"
}

run() {
    if ! python3 -c "import datasets, evaluate" 2>/dev/null; then  # the GPU image lacks them; carried as wheels
        mkdir -p /tmp/site
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$ASSETS"/wheels-py312/*.whl
    fi
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BITFIT_HF_OFFLINE=1
    export BITFIT_HF_CACHE=/tmp/assets
    [ -d /tmp/mpnet-fp16 ] || python3 benchmarks/carry_checkpoint.py unpack "$ASSETS/mpnet" /tmp/mpnet-fp16
    [ -d /tmp/assets ] || python3 benchmarks/carry_checkpoint.py unpack "$ASSETS/data" /tmp/assets
    mkdir -p outputs
    [ -d outputs/study-gpu ] || cp -r docs/reproduction/gpu/study outputs/study-gpu
    local out=${OUT:-outputs/gpu-finish}
    mkdir -p "$out"
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
      python3 -c "import sys, torch, transformers, datasets, peft; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, datasets.__version__, peft.__version__)"; } > "$out/environment.txt"
    timeout "${STUDY_LIMIT:-420}" python3 -m bitfit_hf.study "${STUDY[@]}" --jobs "${JOBS:-7}" --no_progress \
        || echo "the study stopped (exit $?); the cells that finished are kept, a later call resumes the rest"
    python3 -m bitfit_hf.study "${STUDY[@]}" --report_only
    cp -r outputs/study-gpu/cells "$out/"
    cp outputs/study-gpu/*.md outputs/study-gpu/*.json "$out/" 2>/dev/null || true
}

case "${1:-}" in
    prepare) prepare ;;
    plan) plan ;;
    run) run ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
