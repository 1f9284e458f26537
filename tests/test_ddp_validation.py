"""Validation under DDP scores every validation row exactly once: two CPU processes (ddp over gloo, this
file run as a script: Lightning's ddp relaunches it, which pytest cannot host) count the same scored
tokens and report the same metrics as one process, on a row count (33) that does not divide between them
(the loader pads with unscored rows, see archlab.data.stream.RankPadded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from helpers.training import TinyData

from archlab import compose_model
from archlab.config import model_config_dict
from archlab.training.module import LitModel

pytestmark = pytest.mark.usefixtures("single_thread")

ROWS, SEQ_LEN = 33, 12  # each row scores SEQ_LEN - 1 targets (TinyData leaves the first unscored)


class CountScored(L.Callback):
    """At validation's end (before the module reduces and resets its metrics), the scored-token weight of
    the loss metric summed over processes, written by rank 0."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_validation_epoch_end(self, trainer, pl_module):
        local = pl_module.val_loss["val"].weight.detach().clone().reshape(1)
        total = trainer.strategy.reduce(local, reduce_op="sum")
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(float(total)))


def _validate(devices: int, path: Path) -> dict[str, float]:
    """Validate a fixed model on ``devices`` CPU processes; rank 0 writes the metrics and the scored count."""
    L.seed_everything(0, verbose=False)
    model = compose_model(["model=nano", "model.n_layer=1", "model.d_model=32", "model.attention.n_head=2"])
    model.vocab_size, model.context_length = 16, SEQ_LEN
    sched = {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None}
    optim = {"kind": "adamw", "lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}
    lit = LitModel(model_config_dict(model), optim, sched)
    lit.configure_model()  # built here, once: both processes receive these very weights
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[CountScored(str(path))],
    )
    (metrics,) = trainer.validate(lit, datamodule=TinyData(seq_len=SEQ_LEN, batch_size=4, val_examples=ROWS))
    return {**metrics, "scored": json.loads(path.read_text()) if trainer.is_global_zero else None}


@pytest.mark.slow  # two processes (about 25 s): -m slow
def test_two_process_validation_equals_one_process(tmp_path):
    one = _validate(1, tmp_path / "one.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "two.json")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "two.json.metrics").read_text())
    assert one["scored"] == two["scored"] == ROWS * (SEQ_LEN - 1)  # no row dropped, none counted twice
    for key in ("val/loss", "val/acc", "val/ppl"):
        assert two[key] == pytest.approx(one[key], rel=1e-6, abs=1e-7), key


if __name__ == "__main__":  # the two-process side (each rank runs this; rank 0 writes the files)
    import torch

    torch.set_num_threads(1)
    result = _validate(2, Path(sys.argv[1]))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        Path(sys.argv[1] + ".metrics").write_text(json.dumps(result))
