"""The server's whole process group is ended on stop, including the python-backend stubs a dead
tritonserver leaves behind (they ignore SIGTERM and keep their CPU)."""

import os
import signal
import time

import pytest

from e2e_helpers import deploy, tiny_deployment
from toolkit import pipeline
from toolkit.serve.server import group_members

pytestmark = pytest.mark.e2e


def test_stop_ends_the_stubs_of_a_killed_tritonserver(tmp_path, tiny_model_dir):
    """... and removes the shared-memory regions the killed server left in /dev/shm (its own prefix only)."""
    from pathlib import Path

    config, layout = tiny_deployment(tmp_path, tiny_model_dir, name="lifecycle")
    handle = deploy(config, layout)
    regions = sorted(Path("/dev/shm").glob(f"{handle.shm_prefix}*"))
    try:
        assert handle.shm_prefix and regions  # the python backend names its regions with the server's prefix
        members = group_members(handle.pid)
        stubs = [pid for pid, name in members if pid != handle.pid]
        assert any(name == "tritonserver" for _, name in members) and stubs, members
        os.kill(handle.pid, signal.SIGKILL)  # as a crash or an OOM kill would
        time.sleep(1.0)
        orphans = group_members(handle.pid)
        assert orphans and handle.pid not in {pid for pid, _ in orphans}  # the stubs outlive the server
        stopped = pipeline.stop(layout)
    finally:
        if group_members(handle.pid):
            os.killpg(handle.pid, signal.SIGKILL)
    assert group_members(handle.pid) == []
    assert all(region.exists() is False for region in regions)  # a SIGKILL leaves them; stop removed them
    assert {f"{name} ({pid})" for pid, name in orphans} <= set(stopped.ended)
    assert "ended" in stopped.stop_summary and str(orphans[0][0]) in stopped.stop_summary
    assert not layout.server_state_file.exists()


def test_replicas_assembling_the_cpu_backend_dir_side_by_side_do_not_race(tmp_path):
    """Two replicas started at once share one work dir (the testbed does this); unlink-then-symlink
    lost that race as EEXIST and one replica never started."""
    import threading

    from toolkit.serve.install import cpu_triton

    errors: list[Exception] = []

    def assemble():
        try:
            for _ in range(30):
                cpu_triton(tmp_path)
        except Exception as error:  # noqa: BLE001 — collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=assemble) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    backend = tmp_path / "triton_backends" / "python"
    assert sorted(p.name for p in backend.iterdir()) == [
        "libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert all(p.resolve().is_file() for p in backend.iterdir())
