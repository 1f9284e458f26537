"""Bad input gets one clear error before any work: a table of mistakes in the model, data, trainer,
optimizer, schedule, callbacks, sweep settings, data files and checkpoints, each composed exactly as
``archlab-train`` composes it and run through ``train`` (which stops before building any weights), each
with the field and the message it must name. A few go through the real CLI: one line, exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException

from archlab.build import compose
from archlab.errors import ConfigError
from archlab.training.run import train

pytestmark = pytest.mark.usefixtures("single_thread")

# small MQAR and model: what the rows that get past the data step build
MQAR = ["data.num_pairs=2", "data.num_keys=8", "data.num_values=8", "data.val_examples=32", "data.batch_size=8"]
SMALL = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.attention.n_head=2",
    "scheduler.warmup_steps=2",
    "logger=none",
    "callbacks.samples=null",
]


def write_shards(directory: Path, train, val, dtype: str = "uint16", meta: dict | str | None = None) -> Path:
    """Raw little-endian shards and, when given, a meta.json (a dict, or the file's text as is)."""
    directory.mkdir(parents=True)
    np.asarray(train, dtype=np.dtype(dtype).newbyteorder("<")).tofile(directory / "train.bin")
    np.asarray(val, dtype=np.dtype(dtype).newbyteorder("<")).tofile(directory / "val.bin")
    if meta is not None:
        (directory / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Every bad file of the table, and a real checkpoint of a 2-step run (n_layer=1 on the small MQAR)."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "latin1.txt").write_bytes("café au lait ".encode("latin-1") * 20)
    (root / "empty.txt").write_text("")
    (root / "short.txt").write_text("abcdefghijklmnopqrst")  # 18 training and 2 validation characters
    ids, meta = (
        [i % 10 for i in range(100)],
        {"vocab_size": 10, "dtype": "uint16", "train_tokens": 100, "val_tokens": 50},
    )
    write_shards(root / "big_id", [*ids[:99], 12], ids[:50], meta=meta)
    write_shards(root / "no_meta", [i % 20 for i in range(100)], ids[:50])
    write_shards(root / "wrong_dtype", ids, ids[:50], dtype="uint32", meta=meta)
    write_shards(root / "bad_json", ids, ids[:50], meta="{vocab_size: 10")
    write_shards(root / "no_dtype", ids, ids[:50], meta={"vocab_size": 10})
    write_shards(root / "empty_train", [], ids[:50], meta={**meta, "train_tokens": 0})
    write_shards(root / "no_val", ids, ids[:50], meta=meta)
    (root / "no_val" / "val.bin").unlink()
    odd = write_shards(root / "odd_bytes", ids, ids[:50], meta=meta)
    (odd / "train.bin").write_bytes((odd / "train.bin").read_bytes() + b"\x00")

    run = root / "run"
    train(
        compose(
            "train",
            [
                f"paths.output_dir={run}",
                *MQAR,
                *SMALL,
                "trainer.max_steps=2",
                "scheduler.warmup_steps=1",
                "trainer.val_check_interval=2",
            ],
        )
    )
    ckpt = run / "checkpoints" / "last.ckpt"
    (root / "truncated.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    torch.save({"state_dict": {"w": torch.zeros(2)}}, root / "foreign.ckpt")
    resume_dir = root / "resume_corrupt" / "checkpoints"
    resume_dir.mkdir(parents=True)
    (resume_dir / "last.ckpt").write_bytes(b"not a checkpoint")
    (root / "a_file").write_text("x")
    return {"root": str(root), "ckpt": str(ckpt)}


# (overrides, field named, part of the message); "{root}" and "{ckpt}" are filled in from `files`
ROWS = [
    # trainer
    (["trainer.max_steps=0"], "trainer.max_steps", "a positive integer"),
    (["trainer.precision=fp8"], "trainer.precision", "one of ['32', '32-true', 'bf16-mixed'"),
    (["trainer.precision=16-mixed"], "trainer.precision", "bf16-mixed or 32-true on a CPU"),
    (["trainer.accelerator=tpu"], "trainer.accelerator", "one of ['cpu', 'gpu'"),
    (["trainer.devices=0"], "trainer.devices", "a positive integer, a list of device ids"),
    (["trainer.devices=[0,1]"], "trainer.devices", "a number of processes for accelerator=cpu"),
    (["trainer.strategy=horovod"], "trainer.strategy", "one of ['auto', 'ddp'"),
    (["trainer.num_nodes=0"], "trainer.num_nodes", "a positive integer"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval", "a positive integer"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches", "a positive integer"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val", "a positive number, or null"),
    (["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches", "a fraction in (0, 1]"),
    (["trainer.max_time=12h"], "trainer.max_time", "DD:HH:MM:SS"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps", "a positive integer"),
    # optimizer and schedule
    (["optim.lr=0"], "optim.lr", "a positive number"),
    (["optim.lr=inf"], "optim.lr", "a positive number"),
    (["optim.betas=[0.9,1.0]"], "optim.betas", "two numbers in [0, 1)"),
    (["optim.eps=0"], "optim.eps", "a positive number"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay", "a non-negative number"),
    (["optim.momentum=0.9"], "optim.momentum", "null: optim.kind=adamw does not use it (optim=sgd|muon does)"),
    (["optim.kind=adam"], "optim.kind", "one of ['adamw', 'sgd', 'muon']"),
    (["optim=sgd", "optim.nesterov=null"], "optim.nesterov", "a value: optim.kind=sgd needs it"),
    (["optim=muon", "optim.adjust_lr_fn=keller"], "optim.adjust_lr_fn", "one of ['original', 'match_rms_adamw']"),
    (["optim=muon", "trainer=fsdp"], "optim.kind", "adamw or sgd under a sharded trainer"),
    (["scheduler.warmup_steps=-1"], "scheduler.warmup_steps", "a non-negative integer"),
    (["scheduler.warmup_steps=5000"], "scheduler.warmup_steps", "fewer than trainer.max_steps=1500"),
    (
        ["scheduler.warmup_steps=10", "scheduler.decay_steps=5"],
        "scheduler.decay_steps",
        "more than scheduler.warmup_steps=10",
    ),
    (["scheduler.min_lr_ratio=1.5"], "scheduler.min_lr_ratio", "a number in [0, 1]"),
    (["scheduler.kind=step"], "scheduler.kind", "one of ['cosine', 'linear', 'constant', 'wsd']"),
    (["scheduler=wsd", "scheduler.decay_fraction=0"], "scheduler.decay_fraction", "strictly between 0 and 1"),
    (["scheduler=constant", "scheduler.decay_steps=100"], "scheduler.decay_steps", "null: scheduler.kind=constant"),
    (["logger=wandb", "logger.wandb.mode=cloud"], "logger.wandb.mode", "null (WANDB_MODE, else online"),
    # run settings, callbacks, loggers, output
    (["seed=-1"], "seed", "an integer in [0, 2**32)"),
    (["resume=latest"], "resume", 'null or "auto"'),
    (["ckpt_path=/nonexistent/x.ckpt"], "ckpt_path", "an existing checkpoint file"),
    (["ckpt_path={ckpt}", "resume=auto"], "resume", "null when ckpt_path is given"),
    (
        ["callbacks.checkpoint.every_n_train_steps=-2"],
        "callbacks.checkpoint.every_n_train_steps",
        "a non-negative integer",
    ),
    (["callbacks.checkpoint.save_top_k=-3"], "callbacks.checkpoint.save_top_k", "-1 (keep all), 0 (none)"),
    (["callbacks.checkpoint.mode=best"], "callbacks.checkpoint.mode", "one of ['min', 'max']"),
    (["callbacks.checkpoint.monitor=val/bleu", *MQAR], "callbacks.checkpoint.monitor", "null or one of val/loss"),
    (["callbacks.finite_loss.action=ignore"], "callbacks.finite_loss.action", "stop (fail the run at the step) | skip"),
    (
        ["+callbacks.extra={_target_: lightning.pytorch.callbacks.NoSuchCallback}"],
        "callbacks.extra._target_",
        "an importable class or function",
    ),
    (["+logger.wandb={_target_: nowhere.Logger}"], "logger.wandb._target_", "No module named 'nowhere'"),
    (["paths.output_dir={root}/a_file"], "paths.output_dir", "a directory (this path is a file)"),
    # model
    (["model.attention.n_head=5"], "model.attention.n_head", "a divisor of model.d_model=32"),
    (["model.dropout=1.5"], "model.dropout", ""),
    (["model.n_layer=0"], "model.n_layer", "a positive number"),
    (["model.head.tied=false", "model.head.vocab=4", *MQAR], "model.head.vocab", "the data's ids reach"),
    (["model.linear.kind=bitlinear", "model.linear.weights=offline"], "model.linear.weights", "online to train"),
    # sweep settings
    (["objective=val/bleu", *MQAR], "objective", "null (the first validation loss) or one of val/loss"),
    (["hparams_search=optuna_lr", "objective=val/acc"], "hydra.sweeper.direction", "maximize for objective=val/acc"),
    (
        ["hparams_search=optuna_lr", "hydra.sweeper.direction=maximize"],
        "hydra.sweeper.direction",
        "minimize for objective=val/loss",
    ),
    (["match.reference=5", *MQAR], "match.reference", "null, or model fields to change"),
    (["match.reference={mlp: {kind: gelu}}", "match.field=n_head", *MQAR], "match.field", "one of"),
    # data settings
    (["data.num_pairs=0"], "data.num_pairs", "an integer >= 1"),
    (
        ["data.num_pairs=20", "data.num_keys=16"],
        "data.num_keys",
        "at least max(data.num_pairs, data.eval_num_pairs)=40",
    ),
    (["data.batch_size=0"], "data.batch_size", "an integer >= 1"),
    (["+data.shuffle=true"], "data.shuffle", "an argument of archlab.data.MQARDataModule: num_pairs"),
    (["data=text"], "data.path", "a value: archlab.data.TextDataModule needs it"),
    (["data=text", "data.path={root}/missing.txt"], "data.path", "no file there"),
    (["data=text", "data.path={root}/empty.txt"], "data.path", "the file is empty"),
    (["data=text", "data.path={root}/latin1.txt"], "data.path", "byte 3 is not UTF-8"),
    (["data=text", "data.path={root}/short.txt", "data.seq_len=8"], "data.seq_len", "at most 1: "),
    (["data=text", "data.path={root}/short.txt", "data.vocab=word"], "data.vocab", "char (one id per distinct"),
    # token shards
    (["data=tokens", "data.dir={root}/nowhere"], "data.dir", "a directory holding train.bin and val.bin"),
    (
        ["data=tokens", "data.dir={root}/big_id", "data.seq_len=8"],
        "data.dir",
        "token ids below vocab_size=10: train.bin holds id 12 (meta.json disagrees with its shards)",
    ),
    (
        ["data=tokens", "data.dir={root}/no_meta", "data.seq_len=8", "data.vocab_size=10", "data.dtype=uint16"],
        "data.vocab_size",
        "train.bin holds id 19 (data.vocab_size must be at least 20)",
    ),
    (["data=tokens", "data.dir={root}/no_meta", "data.seq_len=8"], "data.vocab_size", "has no meta.json"),
    (
        ["data=tokens", "data.dir={root}/wrong_dtype", "data.seq_len=8"],
        "data.dir",
        "train.bin holds 200 uint16 ids, meta.json says 100",
    ),
    (["data=tokens", "data.dir={root}/odd_bytes", "data.seq_len=8"], "data.dir", "whole uint16 ids (it has 201 bytes)"),
    (["data=tokens", "data.dir={root}/bad_json", "data.seq_len=8"], "data.dir", "a meta.json that is JSON"),
    (["data=tokens", "data.dir={root}/no_dtype", "data.seq_len=8"], "data.dir", "lacks dtype"),
    (["data=tokens", "data.dir={root}/empty_train", "data.seq_len=8"], "data.dir", "a non-empty train.bin"),
    (["data=tokens", "data.dir={root}/no_val", "data.seq_len=8"], "data.dir", "a directory with val.bin"),
    (
        ["data=tokens", "data.dir={root}/big_id", "data.seq_len=8", "data.dtype=uint32"],
        "data.dtype",
        "null or 'uint16', the value in",
    ),
    # checkpoints
    (["ckpt_path={root}/truncated.ckpt", *MQAR], "ckpt_path", "this one does not load (RuntimeError: "),
    (["ckpt_path={root}/foreign.ckpt", *MQAR], "ckpt_path", "records no hyper_parameters.model"),
    (
        ["ckpt_path={ckpt}", *MQAR, "model.n_layer=2"],
        "ckpt_path",
        "a checkpoint of this run's model; it differs in model.n_layer: checkpoint 1, this run 2",
    ),
    (
        ["ckpt_path={ckpt}", *MQAR, "data.num_values=9", "model.d_model=48", "model.norm.eps=1e-6"],
        "ckpt_path",
        "model.d_model: checkpoint 32, this run 48; model.norm.eps: checkpoint 1e-05, this run 1e-06; "
        "model.vocab_size: checkpoint 16, this run 17",
    ),
    (["resume=auto", "paths.output_dir={root}/resume_corrupt", *MQAR], "resume", "this one does not load"),
]


def _fill(items: list[str], files: dict[str, str]) -> list[str]:
    return [item.replace("{root}", files["root"]).replace("{ckpt}", files["ckpt"]) for item in items]


@pytest.mark.parametrize("overrides, field, message", ROWS, ids=[" ".join(r[0])[:70] for r in ROWS])
def test_bad_input_is_one_error_naming_field_and_value_before_any_work(files, tmp_path, overrides, field, message):
    overrides = _fill(overrides, files)
    out = tmp_path / "run"
    given = [o for o in overrides if o.startswith("paths.output_dir=")]
    cfg = compose(
        "train", [*([] if given else [f"paths.output_dir={out}"]), *SMALL, *overrides], return_hydra_config=True
    )
    with pytest.raises(ConfigError) as err:
        train(cfg)
    text = str(err.value)
    assert err.value.field == field, text
    assert text.startswith(f"{field}={err.value.value!r} is invalid: allowed ") and message in text, text
    assert not (out / "checkpoints").exists() and not (out / "model.safetensors").exists()


def test_the_table_covers_every_settings_group():
    groups = {row[1].split(".")[0] for row in ROWS}
    assert {
        "trainer",
        "optim",
        "scheduler",
        "model",
        "data",
        "callbacks",
        "logger",
        "ckpt_path",
        "resume",
        "seed",
        "objective",
        "match",
        "hydra",
        "paths",
    } <= groups
    assert len(ROWS) >= 30


@pytest.mark.parametrize(
    "override, says",
    [
        ("logger=neptune", "Could not find 'logger/neptune'"),  # Hydra lists the options: csv, mlflow, ...
        ("trainer.max_steps=many", "Value 'many' of type 'str' could not be converted to Integer"),
        ("seed=0.5", "Value '0.5' of type 'float' could not be converted to Integer"),
        ("optim.beta1=0.9", "Could not override 'optim.beta1'"),
    ],
)
def test_mistakes_hydra_catches_while_composing(override, says):
    with pytest.raises(ConfigCompositionException) as err:
        compose("train", ["paths.output_dir=/unused", override])
    assert says in str(err.value) or says in str(err.value.__cause__)


def test_cli_prints_one_line_and_exits_2(files, tmp_path):
    """Three mistakes through the real ``archlab-train``, run side by side: a setting, a data file and
    an incompatible checkpoint. Each prints one ``error:`` line (no traceback) and exits with status 2."""
    cases = {
        "setting": (["optim.lr=0"], "error: optim.lr=0.0 is invalid: allowed a positive number"),
        "data": (
            ["data=text", f"data.path={files['root']}/latin1.txt"],
            f"error: data.path='{files['root']}/latin1.txt' is invalid: allowed an existing, non-empty UTF-8 "
            "text file (byte 3 is not UTF-8)",
        ),
        "checkpoint": (
            [f"ckpt_path={files['ckpt']}", *MQAR, "model.n_layer=2"],
            f"error: ckpt_path='{files['ckpt']}' is invalid: allowed a checkpoint of this run's model; "
            "it differs in model.n_layer: checkpoint 1, this run 2",
        ),
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "archlab.cli.train", f"hydra.run.dir={tmp_path / name}", *SMALL, *overrides],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (overrides, _) in cases.items()
    }
    for name, (_, line) in cases.items():
        _, stderr = procs[name].communicate(timeout=300)
        assert procs[name].returncode == 2 and stderr.strip().splitlines() == [line], stderr[-2000:]
        assert not (tmp_path / name / "checkpoints").exists()


def test_full_trace_with_hydra_full_error(monkeypatch, capsys):
    """The wrapper of archlab-train's task: a config mistake is one line and exit 2, a run stopped by a
    NaN one line and exit 1; with HYDRA_FULL_ERROR=1 the exception itself (its full trace)."""
    from archlab.cli.errors import short_config_errors

    errors = {
        2: ConfigError("optim.lr", 0.0, "a positive number"),
        1: FloatingPointError("train/loss is nan at step 8; stopped before that step changed any weight."),
    }
    for status, error in errors.items():

        @short_config_errors
        def task(error=error):
            raise error

        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
        with pytest.raises(SystemExit) as stop:
            task()
        assert stop.value.code == status and capsys.readouterr().err == f"error: {error}\n"
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
        with pytest.raises(type(error)):
            task()
