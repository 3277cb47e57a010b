#!/usr/bin/env bash
# The embedded engine's benchmark on a bare GPU machine (docs/gpu-validation.md records its runs): the toolkit's
# `small` preset created, quantized by ModelOpt (calibrated on the GPU: quantize.calib_device auto) and run by
# perf/gpu_engine_bench.py against the planner's floors for that GPU. Figures and logs land in $OUT
# (default /tmp/gpu-engine-check).
#
#   bash perf/gpu_engine_check.sh                     # the NGC container, or any python3 with a CUDA torch
#   FORMATS="none fp8" BENCH_ARGS="--batches 1,8" bash perf/gpu_engine_check.sh
#
# Python packages the machine lacks (pydantic, nvidia-modelopt, ... on a plain PyTorch image) may lie as wheels
# in .whl/; they are installed to /tmp/site and put on the path after the repository.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-engine-check}
python=${PYTHON:-python3}
config=${CONFIG:-configs/cpu-small.yaml}
formats=${FORMATS:-none fp8 int8_sq int4_awq}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_engine_check: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  | tee "$out/nvidia-smi.csv"

start=$SECONDS
"$python" -m toolkit init-model -c "$config" > "$out/init-model.log" 2>&1 \
  || { tail -n 20 "$out/init-model.log" >&2; exit 1; }
echo "init-model: $((SECONDS - start)) s"
for q in $formats; do  # in parallel: each is mostly start-up and a few seconds of calibration on a GPU
  (s=$SECONDS; quantize() { timeout "${QUANTIZE_TIMEOUT_S:-300}" "$python" -m toolkit quantize -c "$config" \
                               --qformat "$q" "$@" >> "$out/quantize-$q.log" 2>&1; }
   # If calibrating on the GPU fails, the CPU's result still gives the engine a checkpoint to run.
   quantize || { echo "quantize $q on the GPU failed: $(tail -n 1 "$out/quantize-$q.log"); again on the CPU"
                 quantize --set quantize.calib_device=cpu; }
   echo "quantize $q: exit $? after $((SECONDS - s)) s: $(tail -n 1 "$out/quantize-$q.log")") &
done
wait
# shellcheck disable=SC2086  # BENCH_ARGS: several words on purpose
"$python" perf/gpu_engine_bench.py --formats "$(echo $formats | tr ' ' ,)" --json "$out/gpu-engine.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$out/gpu-engine.txt"
echo "gpu_engine_check: $((SECONDS - start)) s in all; figures in $out"
