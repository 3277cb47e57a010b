import os
import tempfile

import pytest

# The python-backend stub and tokenizers spawn threads; keep CI on 2 cores predictable.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests write only under temp dirs: what the toolkit compiles or probes once per machine (toolkit/cache.py)
# goes to a per-session folder, set before any toolkit module reads it (servers started by tests inherit it).
os.environ["TOOLKIT_CACHE"] = tempfile.mkdtemp(prefix="toolkit-test-cache-")
os.environ["MPLCONFIGDIR"] = os.path.join(os.environ["TOOLKIT_CACHE"], "matplotlib")  # its font cache, likewise


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The offline tiny preset, created once per test session."""
    from toolkit.model.factory import create_offline_model

    return create_offline_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


def pytest_sessionfinish(session, exitstatus):
    import shutil

    shutil.rmtree(os.environ["TOOLKIT_CACHE"], ignore_errors=True)
