"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny models on one intra-op thread: thread hand-offs cost far more than such
    small matmuls, most of all on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
