"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny models on one intra-op thread: thread hand-offs cost far more than such
    small matmuls, most of all on a busy 2-core machine. A module asks for it with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    """A config directory holding the tiny datamodule (``data=tiny``) of ``helpers.training``, for the
    training tests' ``hydra.searchpath``; one per module."""
    from helpers.training import tiny_config_dir

    return tiny_config_dir(tmp_path_factory.mktemp("conf"))
