#!/usr/bin/env bash
# The embedded engine's benchmark on a bare GPU machine (docs/gpu-validation.md records its runs): the toolkit's
# `small` preset created, quantized by ModelOpt (calibrated on the GPU: quantize.calib_device auto) and run by
# perf/gpu_engine_bench.py against the planner's floors for that GPU; then perf/gpu_engine_generate.py, the engine
# end to end on the tiny preset against the CPU engine. Figures and logs land in $OUT
# (default /tmp/gpu-engine-check).
#
#   bash perf/gpu_engine_check.sh                     # the NGC container, or any python3 with a CUDA torch
#   FORMATS="none fp8" BENCH_ARGS="--batches 1,8" bash perf/gpu_engine_check.sh
#   PYTHON=.venv/bin/python BENCH_ARGS="--device cpu --gpu h100-sxm" GENERATE_ARGS="--device cpu" ...  # a dry run
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
# shellcheck disable=SC2086  # BENCH_ARGS, GENERATE_ARGS: several words on purpose
"$python" perf/gpu_engine_bench.py --formats "$(echo $formats | tr ' ' ,)" --json "$out/gpu-engine.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$out/gpu-engine.txt"
# End to end on the tiny preset in float32: scheduler, sampling, speculation and graphs against the CPU engine.
tiny=(-c configs/cpu-tiny.yaml --set quantize.qformat=none)
{ "$python" -m toolkit init-model -c configs/cpu-tiny.yaml && "$python" -m toolkit quantize "${tiny[@]}" \
    && "$python" -m toolkit build "${tiny[@]}"; } > "$out/tiny-build.log" 2>&1 \
  && "$python" perf/gpu_engine_generate.py build/engines/cpu-tiny-cpu --json "$out/gpu-engine-generate.json" \
       ${GENERATE_ARGS:-} 2>&1 \
    | tee "$out/gpu-engine-generate.txt" \
  || echo "gpu_engine_check: the end-to-end check did not run: $(tail -n 1 "$out/tiny-build.log")"
echo "gpu_engine_check: $((SECONDS - start)) s in all; figures in $out"
