import os

import pytest

# The python-backend stub and tokenizers spawn threads; keep CI on 2 cores predictable.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The offline tiny preset, created once per test session."""
    from toolkit.model.factory import create_offline_model

    return create_offline_model("tiny", tmp_path_factory.mktemp("models") / "tiny")
