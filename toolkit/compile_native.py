"""Compile one C/C++ source file into a shared library with the system compiler, cached by content.

Used for the project's Triton backends (toolkit/repo/native.py) and the CPU engine's fused kernels
(toolkit/engine/runtime/native_kernels.py). The cache key covers the source, the compiler and its
flags, so an edit or a different flag set builds anew and a second use is free.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from toolkit.cache import CACHE_ROOT
from toolkit.errors import ToolkitError

CACHE_DIR = CACHE_ROOT / "native"


def find_compiler(language: str = "c++") -> str | None:
    """$CXX (or $CC for C), else the usual names on PATH."""
    names = ((os.environ.get("CXX"), "g++", "c++", "clang++") if language == "c++"
             else (os.environ.get("CC"), "gcc", "cc", "clang"))
    for candidate in names:
        if candidate and shutil.which(candidate):
            return candidate
    return None


def compiled_library(name: str, library_name: str, source_name: str, code: bytes, compiler: str,
                     flags: list[str], extra_key: str = "") -> Path:
    """Path of `library_name` built from `code` (written as `source_name`); raises ToolkitError with the
    compiler's message when the build fails. `extra_key` adds what else the binary depends on
    (e.g. the CPU model when compiling with -march=native)."""
    key = hashlib.sha256(code + " ".join([compiler, *flags, extra_key]).encode()).hexdigest()[:16]
    library = CACHE_DIR / f"{name}-{key}" / library_name
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    source_copy = library.parent / source_name
    source_copy.write_bytes(code)
    # A unique partial name, renamed into place: two processes building at once both succeed.
    partial = library.with_name(f"{library.name}.{os.getpid()}.partial")
    # The compiler's messages are UTF-8 (gcc quotes names in ‘’) and a Triton python stub runs in an ASCII locale.
    result = subprocess.run([compiler, *flags, "-o", str(partial), str(source_copy)], capture_output=True, text=True,
                            encoding="utf-8", errors="replace")
    if result.returncode != 0:
        raise ToolkitError(f"compiling {name} failed: {result.stderr.strip()[-400:]}",
                           f"check that the compiler ({compiler}) works, or set CC / CXX to one that does")
    os.replace(partial, library)
    return library
