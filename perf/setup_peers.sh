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
if ! "$py" -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$peers/venv/bin/pip" install -q "$peers"/sdist/llama_cpp_python-*.tar.gz
fi
if [ ! -d "$peers/llama.cpp" ]; then
  tar -xzf "$peers"/sdist/llama_cpp_python-*.tar.gz -C "$peers"
  mv "$peers"/llama_cpp_python-*/vendor/llama.cpp "$peers/llama.cpp"
  rm -rf "$peers"/llama_cpp_python-*/
fi
# llama.cpp's own batched benchmark (N parallel sequences decoding in one batch, as llama-server's slots do):
# only that target, from the same vendored source (~6 min on 2 cores).
if [ ! -x "$peers/llama.cpp/build-bench/bin/llama-batched-bench" ]; then
  cmake -S "$peers/llama.cpp" -B "$peers/llama.cpp/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
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
