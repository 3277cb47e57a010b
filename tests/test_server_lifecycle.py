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
    config, layout = tiny_deployment(tmp_path, tiny_model_dir, name="lifecycle")
    handle = deploy(config, layout)
    try:
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
    assert {f"{name} ({pid})" for pid, name in orphans} <= set(stopped.ended)
    assert "ended" in stopped.stop_summary and str(orphans[0][0]) in stopped.stop_summary
    assert not layout.server_state_file.exists()
