"""The weights' moving average (callbacks.ema): its recurrence by hand from its start step, bad settings
refused naming the field, its weights back after each validation, archlab-eval keeping its results apart and
archlab-report's column (the bit-identical resume with it on, and its validation recomputed from its
exported weights, are in test_train.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers.training import compose_train
from helpers.weights import set_weights, tiny_lit

from archlab.errors import ConfigError
from archlab.training.ema import EMA, swapped_in

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


@pytest.mark.parametrize("device", ["accelerator", "cpu"])
def test_the_average_is_the_recurrence_by_hand_from_its_start_step(device):
    decay, start = 0.75, 2
    lit, ema = tiny_lit(), EMA(decay=decay, start_step=start, device=device)
    trainer = SimpleNamespace(global_step=0)
    expected = None
    for step in range(6):
        trainer.global_step = step
        weights = set_weights(lit, step)
        ema.on_train_batch_end(trainer, lit, None, None, step)  # type: ignore[arg-type]
        if step == start:
            expected = weights  # it starts as the weights after its start step
        elif step > start:
            assert expected is not None
            expected = {n: decay * expected[n] + (1 - decay) * weights[n] for n in weights}
        if step < start:
            assert ema.weights is None
    ema.on_train_batch_end(trainer, lit, None, None, 6)  # type: ignore[arg-type]  # no new step: nothing folded
    assert expected is not None and ema.weights is not None and ema.weights.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(ema.weights[name].double(), value, rtol=0, atol=1e-6)
    assert ema.started_at == start and ema.updated_at == 5


def test_the_weights_swapped_in_for_validation_come_back_bit_for_bit():
    lit = tiny_lit()
    raw = {n: p.detach().clone() for n, p in lit.decoder.named_parameters()}
    average = {n: torch.randn_like(p, dtype=torch.float32) for n, p in raw.items()}
    params = dict(lit.decoder.named_parameters())
    with torch.inference_mode(), swapped_in(average, params):  # as Lightning validates
        assert all(torch.equal(params[n], average[n]) for n in raw)
    assert all(torch.equal(params[n], raw[n]) for n in raw)


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"decay": 1.0}, "callbacks.ema.decay"),
        ({"decay": 0.0}, "callbacks.ema.decay"),
        ({"decay": -0.5}, "callbacks.ema.decay"),
        ({"decay": 0.99, "start_step": -1}, "callbacks.ema.start_step"),
        ({"decay": 0.99, "device": "gpu"}, "callbacks.ema.device"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ConfigError) as refused:
        EMA(**settings)
    assert refused.value.field == field


def test_a_start_step_the_run_never_reaches_is_refused_before_training():
    ema = EMA(decay=0.99, start_step=10)
    with pytest.raises(ConfigError) as refused:
        ema.on_fit_start(SimpleNamespace(max_steps=10), tiny_lit())  # type: ignore[arg-type]
    assert refused.value.field == "callbacks.ema.start_step" and "trainer.max_steps=10" in str(refused.value)


def test_sharded_weights_are_refused_before_training(tmp_path):
    """Under FSDP (parameters are DTensors: each process holds a shard) the average is refused."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        lit = tiny_lit()
        fully_shard(lit.decoder, mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(ConfigError) as refused:
            EMA(decay=0.9).on_fit_start(SimpleNamespace(max_steps=10), lit)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
    assert refused.value.field == "callbacks.ema.decay" and "trainer=fsdp" in str(refused.value)


def test_archlab_train_refuses_a_bad_decay_before_any_work(conf, tmp_path):
    from archlab.training.run import train

    with pytest.raises(ConfigError) as refused:
        train(compose_train(conf, tmp_path / "run", ["callbacks.ema.decay=1.5"]))
    assert refused.value.field == "callbacks.ema.decay"
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_eval_of_a_runs_other_weights_file_keeps_its_own_results(tmp_path):
    """archlab-eval of model_ema.safetensors (or an average) writes eval/<stem>/, never the run's eval/."""
    from archlab.cli.eval import out_dir
    from archlab.config.commands import EvalConfig

    run = tmp_path / "run"
    for name, expected in [
        ("model.safetensors", run / "eval"),
        ("model_ema.safetensors", run / "eval" / "model_ema"),
        ("model_last3.safetensors", run / "eval" / "model_last3"),
    ]:
        cfg = EvalConfig(source=str(run / name), perplexity="x.txt")
        assert out_dir(cfg, run) == expected


def test_report_shows_the_emas_final_loss_beside_the_raw_one_where_runs_kept_one(tmp_path):
    from helpers.report_runs import job, report, rows

    sweep = tmp_path / "sweep"
    for seed, ema in [(0, 2.0), (1, 2.2)]:
        job(sweep, ["scheduler=constant", f"seed={seed}"], [3.0, 2.5], ema={"final": {"step": 20, "val/loss": ema}})
    job(sweep, ["scheduler=wsd", "seed=0"], [3.0, 2.4])  # no average kept: its cell stays empty
    job(sweep, ["scheduler=wsd", "seed=1"], [3.0, 2.4])
    written = report(sweep)
    table = [line for line in written["markdown"].read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header.index("EMA final val/loss") == header.index("final val/loss") + 1
    by_variant = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in table[2:]}
    ema_column = header.index("EMA final val/loss")
    assert by_variant["constant"][ema_column] == "2.10 ± 0.14"  # mean ± sample std of 2.0 and 2.2 (0.141)
    assert by_variant["wsd"][ema_column] in ("", "-")
    csv_rows = {r["scheduler"]: r for r in rows(written["csv"])}
    assert float(csv_rows["constant"]["ema val/loss mean"]) == pytest.approx(2.1)
    assert csv_rows["wsd"]["ema val/loss mean"] == ""
