"""Compile the project's C++ Triton backends (toolkit/repo/cpp_backends/*.cc) with the system compiler.

A backend is one source file compiled to `libtriton_<name>.so`; Triton finds it in the model's
directory. Builds are cached by source hash, so a repository write costs a compile once per machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from toolkit.cache import CACHE_ROOT
from toolkit.errors import ToolkitError

CACHE_DIR = CACHE_ROOT / "native"


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else g++ or c++ on PATH."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build_backend(name: str, source: str) -> Path:
    """Path of `libtriton_<name>.so` compiled from toolkit/repo/cpp_backends/<source> (cached by content)."""
    code = resources.files("toolkit.repo").joinpath("cpp_backends", source).read_bytes()
    cxx = compiler()
    if cxx is None:
        raise ToolkitError(f"no C++ compiler found to build the {name} Triton backend",
                           "install g++ (apt-get install g++) or set CXX; the synthetic model also has a "
                           "python backend (perf/client_accuracy.py --server-backend python)")
    flags = ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread"]
    key = hashlib.sha256(code + " ".join([cxx, *flags]).encode()).hexdigest()[:16]
    library = CACHE_DIR / f"{name}-{key}" / f"libtriton_{name}.so"
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    source_copy = library.parent / source
    source_copy.write_bytes(code)
    partial = library.with_suffix(".so.partial")
    # Triton's symbols are left undefined on purpose: the tritonserver process that loads the
    # backend provides them (libtritonserver), so no Triton headers or libraries are needed here.
    result = subprocess.run([cxx, *flags, "-o", str(partial), str(source_copy)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolkitError(f"compiling the {name} Triton backend failed: {result.stderr.strip()[-400:]}",
                           f"check the compiler ({cxx}) can build C++17")
    partial.rename(library)
    return library
