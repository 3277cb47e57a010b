"""Where the tritonserver binary comes from.

CPU: the real Triton Inference Server bundled in the `nvidia-pytriton` wheel, launched bare with a
backend directory assembled from its python backend and the stub for the running Python.
GPU: `tritonserver` from PATH (the NGC Triton + TensorRT-LLM container).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


def _pytriton_root() -> Path | None:
    try:
        import pytriton  # noqa: F401  (only to find the wheel's files)
    except ImportError:
        return None
    return Path(pytriton.__file__).parent


def cpu_triton(work_dir: Path) -> TritonInstall:
    root = _pytriton_root()
    if root is None:
        raise ToolkitError("nvidia-pytriton is not installed (it carries the CPU tritonserver)",
                           "run `make setup` (pip install nvidia-pytriton==0.7.0)")
    server = root / "tritonserver"
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / minor / "triton_python_backend_stub"
    if not stub.is_file():
        raise ToolkitError(f"nvidia-pytriton has no python backend stub for Python {minor}",
                           "use Python 3.8–3.13 for the virtualenv")
    # A backend directory whose python/ holds the backend library, its utils and the matching stub.
    python_backend = work_dir / "triton_backends" / "python"
    python_backend.mkdir(parents=True, exist_ok=True)
    for source in (server / "backends" / "python" / "libtriton_python.so",
                   server / "backends" / "python" / "triton_python_backend_utils.py", stub):
        _link_atomically(python_backend / source.name, source)
    libs = root.parent / "nvidia_pytriton.libs"
    # The interpreter's own LIBDIR first, or the stub may load the system's libpython of the same minor.
    ld_path = os.pathsep.join(p for p in (str(libs), sysconfig.get_config_var("LIBDIR") or "",
                                          os.environ.get("LD_LIBRARY_PATH", "")) if p)
    # The python models run in a stub process that must find this venv's numpy/torch/transformers.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return TritonInstall(server / "bin" / "tritonserver", python_backend.parent,
                         {"LD_LIBRARY_PATH": ld_path, "PATH": path})


def _link_atomically(link: Path, target: Path) -> None:
    """Point `link` at `target` with a rename, so replicas starting side by side in one work dir never
    see (or race on) a half-made link: unlink-then-symlink lost that race as EEXIST."""
    staging = link.with_name(f".{link.name}.{uuid.uuid4().hex}")  # unique across threads and processes
    staging.symlink_to(target)
    os.replace(staging, link)


def gpu_triton(explicit: str | None) -> TritonInstall:
    binary = explicit or shutil.which("tritonserver")
    if not binary:
        raise ToolkitError("tritonserver is not on PATH",
                           "run inside the NGC Triton + TensorRT-LLM container (see docker/)")
    return TritonInstall(Path(binary))
