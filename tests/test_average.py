"""archlab-average: the file it writes is the elementwise mean of the run's last k checkpoints by step,
and too many, none or a bad output is refused naming the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.weights import set_weights, tiny_config, tiny_lit

from archlab.errors import ConfigError
from archlab.training.average import last_checkpoints
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


def fake_run(run: Path, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """A run directory whose checkpoints hold random weights of the tiny model at ``steps`` (files named
    out of step order), ``last.ckpt`` linking to the newest; returns each step's weights."""
    config = tiny_config()
    (run / "checkpoints").mkdir(parents=True)
    lit, held = tiny_lit(), {}
    for i, step in enumerate(steps):
        set_weights(lit, 100 + step)
        state = {f"model.{k}": v.clone() for k, v in lit.decoder.state_dict().items()}
        held[step] = {k: v.clone() for k, v in lit.decoder.state_dict().items()}
        path = run / "checkpoints" / f"ckpt{len(steps) - i}.ckpt"  # names sort against the steps
        torch.save({"global_step": step, "state_dict": state, "hyper_parameters": {"model": config}}, path)
    newest = max(steps)
    os.symlink(f"ckpt{len(steps) - steps.index(newest)}.ckpt", run / "checkpoints" / "last.ckpt")
    return held


def test_average_of_the_last_k_checkpoints_is_their_elementwise_mean(tmp_path):
    from archlab.cli.average import main

    held = fake_run(tmp_path / "run", [10, 20, 30, 40])
    main([str(tmp_path / "run"), "last=3"])
    averaged = load_weights(tmp_path / "run" / "model_last3.safetensors").state_dict()
    for name, value in averaged.items():  # steps 20, 30, 40: the newest three, last.ckpt not counted twice
        mean = (held[20][name].double() + held[30][name].double() + held[40][name].double()) / 3
        torch.testing.assert_close(value.double(), mean, rtol=0, atol=1e-6)
    main([str(tmp_path / "run"), "last=1", f"out={tmp_path / 'newest.safetensors'}"])
    newest = load_weights(tmp_path / "newest.safetensors").state_dict()
    assert all(torch.equal(newest[k], held[40][k]) for k in newest)


@pytest.mark.parametrize("k, field", [(5, "last"), (0, "last")])
def test_average_refuses_more_checkpoints_than_the_run_holds(tmp_path, k, field):
    fake_run(tmp_path / "run", [10, 20, 30, 40])
    with pytest.raises(ConfigError) as refused:
        last_checkpoints(tmp_path / "run", k)
    assert refused.value.field == field
    if k == 5:
        assert "at most the 4 checkpoint(s)" in str(refused.value) and "10, 20, 30, 40" in str(refused.value)


def test_average_refuses_a_directory_without_checkpoints_and_a_bad_out(tmp_path, capsys):
    from archlab.cli.average import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), "last=2"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith("error: run=") and "holding checkpoints/" in err
    fake_run(tmp_path / "run", [10, 20])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run"), "last=2", "out=averaged.pt"])
    assert capsys.readouterr().err.startswith("error: out='averaged.pt' is invalid")
