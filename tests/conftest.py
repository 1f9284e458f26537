"""Shared test fixtures, and the Hypothesis profiles the property tests run under."""

import os

import pytest
import torch
from hypothesis import settings

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (or pytest --hypothesis-profile, which wins). "ci", the
# default (make test, CI): derandomised, so every run of a commit draws the same examples and the README's
# command passes or fails wherever it runs; no example database replaying a past failure on one machine
# only; a failure prints the blob that reproduces it. "explore" (make explore): new random draws on every
# run, more of them, failures kept in .hypothesis/ and replayed first by the next run; a case it finds
# becomes an @example of its test. Both from Hypothesis' "default" profile, whatever profile it loaded
# itself (it loads its own "ci" where it detects a CI service).
DEFAULT = settings.get_profile("default")
settings.register_profile("ci", DEFAULT, derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", DEFAULT, derandomize=False, max_examples=200, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny models on one intra-op thread: thread hand-offs cost far more than such
    small matmuls, most of all on a busy 2-core machine. A module asks for it with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def eager_bitnet(monkeypatch):
    """transformers' BitNet quantisers (integrations/bitnet.py) run as plain torch code: each is wrapped in
    torch.compile, which costs 10-40 s per function on a cold CPU cache. The compiled runs, whose bf16
    rounding differs, are the slow tests' (``-m slow``)."""
    import inspect

    from transformers.integrations import bitnet

    compiled = [(bitnet, "unpack_weights"), (bitnet.BitLinear, "activation_quant")]
    compiled += [
        (bitnet.BitLinear, "post_quant_process"),
        (bitnet.WeightQuant, "forward"),
        (bitnet.ActQuant, "forward"),
    ]
    for owner, name in compiled:
        static = isinstance(inspect.getattr_static(owner, name), staticmethod)
        plain = getattr(owner, name)._torchdynamo_orig_callable
        monkeypatch.setattr(owner, name, staticmethod(plain) if static else plain)


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    """A config directory holding the tiny datamodule (``data=tiny``) of ``helpers.training``, for the
    training tests' ``hydra.searchpath``; one per module."""
    from helpers.training import tiny_config_dir

    return tiny_config_dir(tmp_path_factory.mktemp("conf"))


# The files that take longest (subprocesses, multi-process and real sweeps), longest first. pytest-xdist
# (`make test`: --dist loadfile --no-loadscope-reorder) hands whole files to its workers in collection
# order, so starting these first lets the workers finish together instead of one running the last
# long file alone. A file not listed keeps its place after them.
LONGEST_FIRST = (
    "test_docs.py",
    "test_multiprocess.py",
    "test_moe.py",
    "test_train.py",
    "test_sweep.py",
    "test_trackers.py",
    "test_commands.py",
    "test_check_cli.py",
    "test_ddp_validation.py",
    "test_run_validation.py",
    "test_front_door.py",
    "test_fault_tolerance.py",
    "test_prepare.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order
