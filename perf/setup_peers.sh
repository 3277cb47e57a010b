#!/usr/bin/env bash
# Peers for perf/engine_bench.py, kept out of the project's own environment: llama.cpp (through
# llama-cpp-python, which compiles it from its sdist: ~9 min on 2 cores) and OpenVINO GenAI (~1 min).
# Usage: bash perf/setup_peers.sh   (idempotent; everything lands under perf/.peers/, git-ignored)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
peers="$here/.peers"
mkdir -p "$peers/sdist"
if [ ! -x "$peers/venv/bin/python" ]; then
  python3 -m venv "$peers/venv"
  "$peers/venv/bin/pip" install -q --upgrade pip
fi
py="$peers/venv/bin/python"
# The sdist is kept: its vendored llama.cpp holds convert_hf_to_gguf.py, which the benchmark runs.
if ! ls "$peers/sdist"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  "$peers/venv/bin/pip" download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$peers/sdist"
fi
# -march=native, except on a CPU with AMX: ggml's AMX path for q4_0 / q8_0 segfaulted on this project's AMX machine
# (Xeon, 2026-11-24; a known, unfixed crash: ggml-org/llama.cpp#20824), so there llama.cpp is built for the
# AVX-512 set such a CPU has (BF16, VNNI, VBMI) without AMX (-mno-amx-* cannot follow ggml's own -march=native).
# A build made with other flags (the stamp) is rebuilt.
flags="-DGGML_NATIVE=ON"
if grep -qw amx_int8 /proc/cpuinfo; then
  flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON"
  flags="$flags -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
fi
# llama-cpp-python's own runtime needs (its install below is --no-deps, so that pip builds nothing else); without
# diskcache `import llama_cpp` fails, which would also rebuild llama.cpp on every run.
"$peers/venv/bin/pip" install -q diskcache jinja2 typing-extensions "numpy<2"
if ! "$py" -c "import llama_cpp" 2>/dev/null || [ "$(cat "$peers/llama-build-flags" 2>/dev/null)" != "$flags" ]; then
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$peers/venv/bin/pip" install -q --force-reinstall --no-deps "$peers"/sdist/llama_cpp_python-*.tar.gz
  rm -rf "$peers/llama.cpp/build-bench"
  echo "$flags" > "$peers/llama-build-flags"
fi
if [ ! -d "$peers/llama.cpp" ]; then
  tar -xzf "$peers"/sdist/llama_cpp_python-*.tar.gz -C "$peers"
  mv "$peers"/llama_cpp_python-*/vendor/llama.cpp "$peers/llama.cpp"
  rm -rf "$peers"/llama_cpp_python-*/
fi
# llama.cpp's own batched benchmark (N parallel sequences decoding in one batch, as llama-server's slots do):
# only that target, from the same vendored source (~6 min on 2 cores).
if [ ! -x "$peers/llama.cpp/build-bench/bin/llama-batched-bench" ]; then
  # shellcheck disable=SC2086  # $flags: several -D options
  cmake -S "$peers/llama.cpp" -B "$peers/llama.cpp/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release $flags \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null \
    && cmake --build "$peers/llama.cpp/build-bench" --target llama-batched-bench -j "$(nproc)" >/dev/null \
    || echo "llama-batched-bench did not build: the peer table has no multi-stream rows"
fi
# The converter's own needs (CPU torch from its own index would download ~200 MB more: reuse numpy-only path).
"$py" -m pip install -q "gguf==0.19.0" "numpy<2" sentencepiece safetensors "transformers>=4.45" \
  || echo "converter dependencies did not install: GGUF conversion will be skipped"
# OpenVINO GenAI in its own venv: optimum-intel exports the checkpoint to OpenVINO IR (NNCF compresses the
# weights), which needs torch: pinned to the CPU build, or the resolver pulls a CUDA torch (~6 GB).
ov="$peers/openvino"
if [ ! -x "$ov/bin/python" ] || ! "$ov/bin/python" -c "import openvino_genai, optimum.intel" 2>/dev/null; then
  python3 -m venv "$ov"
  echo "torch==2.13.0" > "$ov/constraints.txt"
  "$ov/bin/pip" install -q --disable-pip-version-check -c "$ov/constraints.txt" torch==2.13.0 \
      "optimum-intel[openvino,nncf]==2.2.0" "openvino-genai==2026.4.1.0" "openvino-tokenizers==2026.4.1.0" \
      "openvino==2026.4.1" \
    || echo "OpenVINO GenAI did not install: it is left out of the peer table"
  # optimum-intel requires torchvision, whose wheel here is not built for the CPU torch: importing it breaks the
  # export (torchvision::nms does not exist). Text models never use it.
  "$ov/bin/pip" uninstall -q -y torchvision || true
fi
echo "peers ready under $peers"
