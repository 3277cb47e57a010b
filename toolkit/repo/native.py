"""Compile the project's C++ Triton backends (toolkit/repo/cpp_backends/*.cc) with the system compiler.

A backend is one source file compiled to `libtriton_<name>.so`; Triton finds it in the model's
directory. Builds are cached by source hash, so a repository write costs a compile once per machine.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from toolkit.compile_native import compiled_library, find_compiler
from toolkit.errors import ToolkitError

def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else g++ or c++ on PATH."""
    return find_compiler("c++")


def build_backend(name: str, source: str) -> Path:
    """Path of `libtriton_<name>.so` compiled from toolkit/repo/cpp_backends/<source> (cached by content)."""
    code = resources.files("toolkit.repo").joinpath("cpp_backends", source).read_bytes()
    cxx = compiler()
    if cxx is None:
        raise ToolkitError(f"no C++ compiler found to build the {name} Triton backend",
                           "install g++ (apt-get install g++) or set CXX; the synthetic model also has a "
                           "python backend (perf/client_accuracy.py --server-backend python)")
    flags = ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread"]
    # Triton's symbols are left undefined on purpose: the tritonserver process that loads the
    # backend provides them (libtritonserver), so no Triton headers or libraries are needed here.
    return compiled_library(name, f"libtriton_{name}.so", source, code, cxx, flags)
