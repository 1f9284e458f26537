"""A tiny datamodule for the training tests, following the data interface of ``archlab-train``.

Sequences count upwards modulo the vocabulary from a random start (``x[t+1] = x[t] + 1 mod V``), so
a small model learns them in a few dozen steps. Sample ``i`` is a pure function of ``(seed, i)``;
training batch ``k`` holds samples ``[k*G, (k+1)*G)`` of the global batch ``G = W * batch_size``, this
rank taking its slice, and starts after the batches a restored trainer has already seen.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset


def counting(seed: int, first: int, n: int, seq_len: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``first .. first+n-1`` as ``(inputs, targets)``; the first target is not scored."""
    starts = torch.stack(
        [
            torch.randint(vocab, (1,), generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
            for i in range(first, first + n)
        ]
    )
    seq = (starts + torch.arange(seq_len + 1)) % vocab
    inputs, targets = seq[:, :-1].clone(), seq[:, 1:].clone()
    targets[:, 0] = -100
    return inputs, targets


class _Stream(IterableDataset):
    def __init__(self, dm: TinyData, rank: int, world: int, start: int):
        self.dm, self.rank, self.world, self.start = dm, rank, world, start

    def __iter__(self):
        dm, b, k = self.dm, self.dm.batch_size, self.start
        while True:
            first = (k * self.world + self.rank) * b
            yield counting(dm.seed, first, b, dm.seq_len, dm.vocab_size)
            k += 1


class TinyData(L.LightningDataModule):
    val_names = ["val"]

    def __init__(
        self,
        vocab_size: int = 16,
        seq_len: int = 12,
        batch_size: int = 8,
        val_examples: int = 32,
        seed: int = 0,
        with_tokenizer: bool = False,
        chance: bool = True,
    ):
        super().__init__()
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.max_seq_len, self.val_examples, self.seed = seq_len, val_examples, seed
        self.chance_accuracy = 1.0 / vocab_size if chance else None
        self.tokenizer = None
        if with_tokenizer:
            from archlab.tokenizer import CharTokenizer

            self.tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz"[:vocab_size])

    def train_dataloader(self):
        rank, world, start = 0, 1, 0
        if self.trainer is not None:
            rank, world = self.trainer.global_rank, self.trainer.world_size
            start = self.trainer.fit_loop.epoch_loop.batch_progress.total.ready
        return DataLoader(_Stream(self, rank, world, start), batch_size=None)

    def val_dataloader(self):
        from archlab.data.stream import eval_loader

        x, y = counting(self.seed + 1, 0, self.val_examples, self.seq_len, self.vocab_size)
        return [eval_loader(TensorDataset(x, y), self.batch_size, 0, self.trainer)]


TINY_YAML = """\
_target_: helpers.training.TinyData
vocab_size: 16
seq_len: 12
batch_size: 8
val_examples: 32
with_tokenizer: false
"""


def tiny_config_dir(root: Path) -> Path:
    """A config directory holding ``data/tiny.yaml``, for ``hydra.searchpath=[file://<dir>]``."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "tiny.yaml").write_text(TINY_YAML)
    return root


class SaveRankWeights(L.Callback):
    """At fit end, each rank saves what it holds: full tensors, or for FSDP its local shards."""

    def __init__(self, dirpath: str):
        self.dirpath = Path(dirpath)

    def on_fit_end(self, trainer, pl_module):
        from torch.distributed.tensor import DTensor

        state = {
            n: (p.to_local() if isinstance(p, DTensor) else p).detach().cpu().clone()
            for n, p in pl_module.model.named_parameters()
        }
        self.dirpath.mkdir(parents=True, exist_ok=True)
        torch.save(state, self.dirpath / f"rank{trainer.global_rank}.pt")


class SaveMetricSharing(L.Callback):
    """At each validation's start, each rank saves whether any of its metric states lies in shared memory."""

    def __init__(self, dirpath: str):
        self.dirpath = Path(dirpath)

    def on_validation_epoch_start(self, trainer, pl_module):
        from torchmetrics import Metric

        states = [getattr(m, name) for m in pl_module.modules() if isinstance(m, Metric) for name in m._defaults]
        self.dirpath.mkdir(parents=True, exist_ok=True)
        path = self.dirpath / f"rank{trainer.global_rank}_step{trainer.global_step}.json"
        path.write_text(json.dumps(any(t.is_shared() for t in states)))


class FailAt(L.Callback):
    """Raise at a given training step (for the failed-run summary)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"planned failure at step {self.step}")


SMALL = [
    "trainer.precision=32-true",  # the same arithmetic on every machine (trainer=cpu's auto follows the CPU)
    "model.n_layer=1",
    "model.d_model=32",
    "model.attention.n_head=2",
    "scheduler.warmup_steps=5",
    "logger=none",
    "trainer.log_every_n_steps=10",
]


def compose_train(conf: Path, out: Path, overrides: list[str]):
    """The ``train`` config as archlab-train composes it, on the tiny data, writing to ``out``."""
    from archlab.build import compose

    return compose(
        "train",
        [f"hydra.searchpath=[file://{conf}]", "data=tiny", f"paths.output_dir={out}", *SMALL, *overrides],
        return_hydra_config=True,
    )


def cli(conf: Path, run_dir: Path, overrides: list[str], timeout: int = 300, multirun: bool = False):
    """Run ``archlab-train`` in a subprocess on the tiny data; returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    # one intra-op thread: a tiny model on a busy 2-core machine loses far more to thread hand-offs
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "archlab.cli.train",
        *(["-m"] if multirun else []),
        f"hydra.searchpath=[file://{conf}]",
        "data=tiny",
        f"hydra.run.dir={run_dir}",
        *SMALL,
        *overrides,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
