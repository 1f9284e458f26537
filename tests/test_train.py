"""archlab-train: a short CLI fit and its outputs, the python entry, exact resume, config errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.training import cli, compose_train, counting
from safetensors import safe_open

from archlab.accounting import COMPONENTS, count, flops_per_token
from archlab.build import build_model
from archlab.errors import ConfigError, DirectoryHoldsRun
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SUMMARY_FIELDS = {
    "status",
    "error",
    "seed",
    "choices",
    "model",
    "model_from_data",
    "data",
    "flops_per_token",
    "parameters",
    "metrics",
    "primary_metric",
    "throughput",
    "wall_time_s",
    "steps",
    "trainer",
    "paths",
    "samples",
    "config",
    "grad_norm",
}


@pytest.fixture(scope="module")
def cli_run(conf, tmp_path_factory):
    """One short CLI fit with a tokenizer, both loggers and every checkpoint kept."""
    run = tmp_path_factory.mktemp("cli") / "run"
    proc = cli(
        conf,
        run,
        [
            "data.with_tokenizer=true",
            "logger=[csv,tensorboard]",
            "trainer.max_steps=30",
            "trainer.val_check_interval=10",
            "callbacks.checkpoint.save_top_k=-1",
            "callbacks.samples.max_new_tokens=10",  # 4 + 10 tokens: past the context of 12
            "callbacks.samples.prompt_tokens=4",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, proc, json.loads((run / "summary.json").read_text())


def test_cli_prints_where_everything_is_and_the_metric_against_chance(cli_run):
    run, proc, summary = cli_run
    out = proc.stdout
    assert f"summary:    {run / 'summary.json'}" in out
    assert "LeafSpec" not in proc.stderr  # Lightning's per-run deprecation noise is filtered out
    assert f"export:     {run / 'model.safetensors'}" in out
    assert "checkpoint: " + str(run / "checkpoints") in out
    assert "logs:       " in out and str(run / "logs") in out
    acc = summary["metrics"]["final"]["val/acc"]
    assert f"final val/acc: {acc:.4f}  (chance {1 / 16:.4f})" in out


def test_summary_has_every_field(cli_run):
    run, _, s = cli_run
    assert SUMMARY_FIELDS <= s.keys()
    assert s["status"] == "completed" and s["error"] is None and s["steps"] == 30 and s["seed"] == 0
    assert s["choices"]["model"] == "nano" and s["choices"]["model/position"] == "learned"
    assert s["choices"]["data"] == "tiny" and s["choices"]["trainer"] == "cpu"
    # the data set the vocabulary and the context length
    assert s["model_from_data"] == {"vocab_size": 16, "context_length": 12}
    assert s["model"]["vocab_size"] == 16 and s["model"]["context_length"] == 12 and s["model"]["n_layer"] == 1
    assert [h["step"] for h in s["metrics"]["history"]] == [10, 20, 30]
    assert s["metrics"]["final"] == s["metrics"]["history"][-1]
    losses = [h["val/loss"] for h in s["metrics"]["history"]]
    assert s["metrics"]["best"]["val/loss"] == {"value": min(losses), "step": 10 * (1 + losses.index(min(losses)))}
    assert math.isclose(s["metrics"]["final"]["val/ppl"], math.exp(s["metrics"]["final"]["val/loss"]), rel_tol=1e-5)
    assert s["primary_metric"]["name"] == "val/acc" and s["primary_metric"]["chance"] == 1 / 16
    assert s["metrics"]["final"]["val/acc"] > 0.3  # learned: chance is 1/16
    assert s["trainer"]["world_size"] == 1 and s["wall_time_s"] > 0
    assert s["paths"]["export"] == str(run / "model.safetensors")
    assert Path(s["paths"]["checkpoint"]).exists() and Path(s["paths"]["last_checkpoint"]).name == "last.ckpt"


def test_parameter_counts_and_flops_in_summary(cli_run):
    run, _, s = cli_run
    analytic, built = s["parameters"]["analytic"], s["parameters"]["built"]
    assert all(analytic[c] == built[c] for c in (*COMPONENTS, "total"))
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        stored = sum(f.get_tensor(k).numel() for k in f.keys())
    assert built["total"] == stored  # the tied head is stored once, counted once
    model = load_weights(run / "model.safetensors")
    assert s["flops_per_token"] == count(model.cfg)["flops_per_token"]
    t = s["throughput"]
    per_token = flops_per_token(model.cfg, analytic["non_embedding"], 12)  # training windows are 12 long
    assert t["tokens_per_s"] > 0 and math.isclose(t["flops_per_s"] / t["tokens_per_s"], per_token, rel_tol=1e-9)
    assert t["mfu"] is None  # no known peak for a CPU


def test_one_table_of_peaks_for_every_mfu():
    """archlab-train's MFU and archlab-bench's divide by the same peak: the device's, for the dtype it runs."""
    from archlab.bench.peak_flops import device_peak, peak_flops

    assert device_peak("NVIDIA H100 80GB HBM3", torch.bfloat16, tf32=True) == 989.4e12
    assert device_peak("NVIDIA H100 PCIe", torch.bfloat16, tf32=True) == 756e12  # the model before its family
    assert device_peak("NVIDIA H200", torch.float16, tf32=True) == 989.4e12
    assert device_peak("NVIDIA A100-SXM4-80GB", torch.float32, tf32=True) == 156e12  # float32 matmuls as TF32
    assert device_peak("NVIDIA A100-SXM4-80GB", torch.float32, tf32=False) == 19.5e12
    assert device_peak("NVIDIA L4", torch.bfloat16, tf32=True) == 121e12
    assert device_peak("NVIDIA L40S", torch.bfloat16, tf32=True) is None  # whole words: an L40S is no L4
    assert device_peak("NVIDIA A10G", torch.float32, tf32=True) is None  # a dtype the table lacks
    assert peak_flops(torch.device("cpu"), torch.bfloat16) is None


def test_checkpoint_loads_weights_only_and_export_gives_the_same_logits(cli_run):
    run, _, s = cli_run
    ckpt = torch.load(s["paths"]["last_checkpoint"], weights_only=True, map_location="cpu")
    hp = ckpt["hyper_parameters"]
    assert type(hp["model"]) is dict and type(hp["optim"]) is dict and hp["optim"]["lr"] == 1e-3
    reference = build_model(hp["model"])
    reference.load_state_dict(
        {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    )
    exported = load_weights(run / "model.safetensors")
    idx = torch.randint(0, 16, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(idx), reference.eval()(idx), rtol=0, atol=0)
    assert ckpt["global_step"] == 30 and [h["step"] for h in ckpt["archlab_history"]] == [10, 20, 30]


def test_export_carries_the_tokenizer_and_samples_are_decoded(cli_run):
    run, _, s = cli_run
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["archlab_tokenizer"]) == {"kind": "char", "chars": "abcdefghijklmnop"}
    assert len(s["samples"]) == 2
    for sample in s["samples"]:
        assert len(sample["prompt"]) == 4 and len(sample["completion"]) == 10
        assert set(sample["prompt"] + sample["completion"]) <= set("abcdefghijklmnop")


def test_both_loggers_wrote(cli_run):
    run, _, _ = cli_run
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val/loss", "val/ppl", "val/acc", "train/loss", "step"} <= set(header)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_grad_norm_keeps_the_largest_finite_norm_and_its_step():
    from types import SimpleNamespace

    from archlab.training.callbacks import GradNorm

    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = SimpleNamespace(param_groups=[{"params": [weight]}])
    logged = []
    module = SimpleNamespace(log=lambda name, value: logged.append((name, float(value))))
    callback = GradNorm()
    for step, grad in enumerate(([1.0, 0.0], [3.0, 4.0], [float("nan"), 0.0], [0.0, 2.0])):
        weight.grad = torch.tensor(grad)
        callback.on_before_optimizer_step(SimpleNamespace(global_step=step), module, optimizer)  # type: ignore[arg-type]
    assert [v for _, v in logged[:2]] == [1.0, 5.0] and logged[3] == ("train/grad_norm", 2.0)
    assert callback.summary_fields() == {"grad_norm": {"max": 5.0, "step": 2}}  # ||(3, 4)|| after the 2nd step
    restored = GradNorm()
    restored.load_state_dict(callback.state_dict())
    assert restored.summary_fields() == callback.summary_fields()


def test_python_entry_trains_and_resumes_exactly(conf, tmp_path):
    """A run resumed from its step-20 checkpoint (dropout on: the RNG is restored too) ends with the
    same metrics and bit-identical weights as the uninterrupted run, and so does its EMA (started at step
    5, so the checkpoint carries it), whose validation is that of its exported weights."""
    from archlab.training.run import train

    common = [
        "trainer.max_steps=40",
        "trainer.val_check_interval=20",
        "callbacks.checkpoint.save_top_k=-1",
        "model.dropout=0.1",
        "callbacks.ema.decay=0.9",
        "callbacks.ema.start_step=5",
    ]
    full = train(compose_train(conf, tmp_path / "full", common))
    assert full["choices"]["data"] == "tiny" and full["status"] == "completed"
    mid = tmp_path / "full" / "checkpoints" / "step000020.ckpt"
    resumed = train(compose_train(conf, tmp_path / "resumed", [*common, f"ckpt_path={mid}"]))
    assert resumed["resumed_from"] == str(mid)
    assert resumed["metrics"]["history"] == full["metrics"]["history"]
    assert resumed["grad_norm"] == full["grad_norm"]  # the largest before step 20 came with the checkpoint
    a = load_weights(tmp_path / "full" / "model.safetensors").state_dict()
    b = load_weights(tmp_path / "resumed" / "model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["ema"]["history"] == full["ema"]["history"] and full["ema"]["started_at"] == 5
    ema = load_weights(tmp_path / "full" / "model_ema.safetensors")
    resumed_ema = load_weights(tmp_path / "resumed" / "model_ema.safetensors").state_dict()
    assert all(torch.equal(ema.state_dict()[k], resumed_ema[k]) for k in resumed_ema)
    assert not torch.equal(ema.state_dict()["tok_emb.weight"], a["tok_emb.weight"])
    # the EMA's final val/loss is its exported weights' token-weighted loss on the validation rows (the
    # tiny data's: every target but each row's first scored), computed here without the trainer
    inputs, targets = counting(1, 0, 32, 12, 16)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(ema.eval()(inputs).flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert full["ema"]["final"]["val/loss"] == pytest.approx(float(loss), rel=1e-5)
    assert full["metrics"]["final"]["val/loss"] != full["ema"]["final"]["val/loss"]


def test_resume_auto_continues_from_the_newest_checkpoint(conf, tmp_path):
    from archlab.training.run import train

    first = train(compose_train(conf, tmp_path, ["trainer.max_steps=10", "trainer.val_check_interval=5"]))
    assert first["steps"] == 10
    second = train(
        compose_train(conf, tmp_path, ["trainer.max_steps=20", "trainer.val_check_interval=5", "resume=auto"])
    )
    assert second["resumed_from"] == str(tmp_path / "checkpoints" / "last.ckpt")
    assert second["steps"] == 20
    assert [h["step"] for h in second["metrics"]["history"]] == [5, 10, 15, 20]  # history carried over
    with pytest.raises(ConfigError, match="more than the 20 steps") as err:  # fewer steps than it trained
        train(compose_train(conf, tmp_path, ["trainer.max_steps=15", "trainer.val_check_interval=5", "resume=auto"]))
    assert err.value.field == "trainer.max_steps"
    finished = (tmp_path / "summary.json").read_text()
    # already at max_steps: nothing to train, the completed run left as it is (a sweep can be re-run to finish)
    again = train(
        compose_train(conf, tmp_path, ["trainer.max_steps=20", "trainer.val_check_interval=5", "resume=auto"])
    )
    assert again == json.loads(finished) and (tmp_path / "summary.json").read_text() == finished
    # the same with checkpoints off: done at max_steps; to train on, it has nothing to continue from
    off = ["trainer.max_steps=10", "trainer.val_check_interval=5", "callbacks.checkpoint=null"]
    plain = train(compose_train(conf, tmp_path / "off", off))
    assert train(compose_train(conf, tmp_path / "off", [*off, "resume=auto"])) == plain
    with pytest.raises(DirectoryHoldsRun, match="completed run of 10 steps and no checkpoint to continue from"):
        train(compose_train(conf, tmp_path / "off", [*off, "resume=auto", "trainer.max_steps=20"]))
    assert json.loads((tmp_path / "off" / "summary.json").read_text()) == plain
    # killed after its last checkpoint, before the export and summary: resume=auto writes them from it
    exported = load_weights(tmp_path / "model.safetensors").state_dict()
    (tmp_path / "summary.json").unlink()
    (tmp_path / "model.safetensors").unlink()
    ended = train(
        compose_train(conf, tmp_path, ["trainer.max_steps=20", "trainer.val_check_interval=5", "resume=auto"])
    )
    assert ended["status"] == "completed" and ended["metrics"] == second["metrics"]
    # its figures are those of the attempts that trained, kept in the checkpoint: tokens of all 20 steps,
    # and the wall time up to the checkpoint plus this attempt's
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    assert ended["throughput"]["tokens"] == second["throughput"]["tokens"] == 20 * 8 * 12  # steps x batch x seq_len
    assert ended["throughput"]["tokens_per_s"] == pytest.approx(second["throughput"]["tokens_per_s"])
    assert ended["wall_time_s"] > saved["RunRecorder"]["wall_time_s"] > first["wall_time_s"]
    rebuilt = load_weights(tmp_path / "model.safetensors").state_dict()
    assert all(torch.equal(rebuilt[k], exported[k]) for k in exported)


def test_starting_over_in_a_run_directory_is_refused_unless_it_continues_that_run(cli_run, conf, tmp_path):
    """A finished run's summary, export and checkpoints are not overwritten by a re-run that forgot
    resume=auto; continuing it (resume=auto, or one of its own checkpoints) is allowed."""
    from archlab.training.run import train

    run, _, _ = cli_run
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "train.log"}
    assert (run / ".hydra" / "overrides.yaml") in before
    proc = cli(conf, run, ["data.with_tokenizer=true", "trainer.max_steps=30"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(
        f"error: hydra.run.dir='{run}' is invalid: allowed a directory without an earlier "
        "run; this one holds summary.json, model.safetensors, checkpoints. Continue that "
        "run with resume=auto"
    )
    # every file as it was, the run's .hydra (its settings, which archlab-report reads) included
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "train.log"} == before
    # a run writing elsewhere (paths.output_dir) from this Hydra directory leaves its .hydra alone too
    elsewhere = tmp_path / "elsewhere"
    proc = cli(conf, run, ["trainer.max_steps=10", "trainer.val_check_interval=5", f"paths.output_dir={elsewhere}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (elsewhere / "summary.json").exists() and not (run / ".hydra.pending").exists()
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "train.log"} == before

    common = [
        "trainer.max_steps=10",
        "trainer.val_check_interval=5",
        "callbacks.checkpoint.save_top_k=-1",
        "logger=csv",
        "trainer.log_every_n_steps=2",
    ]
    train(compose_train(conf, tmp_path, common))
    log = tmp_path / "logs" / "metrics.csv"
    first = log.read_text()
    with pytest.raises(ConfigError, match="holds summary.json, model.safetensors, checkpoints") as err:
        train(compose_train(conf, tmp_path, common))
    assert err.value.field == "paths.output_dir"
    own = tmp_path / "checkpoints" / "step000005.ckpt"
    again = train(compose_train(conf, tmp_path, [*common, f"ckpt_path={own}"]))  # back to its own step 5
    assert again["resumed_from"] == str(own) and again["steps"] == 10
    # the CSV log keeps its rows up to step 5 and has those after it once, as the same steps logged them
    timing = [i for i, k in enumerate(first.splitlines()[0].split(",")) if k.startswith("perf/")]

    def strip(text):
        return [[v for i, v in enumerate(line.split(",")) if i not in timing] for line in text.splitlines()]

    assert strip(log.read_text()) == strip(first) and len(first.splitlines()) == 1 + 5 + 2  # header, train, val

    # a run that failed before validating (e.g. a mistyped setting) left no results: started over
    mistyped = tmp_path / "mistyped"
    mistyped.mkdir()
    (mistyped / "summary.json").write_text(json.dumps({"status": "failed", "steps": 0, "metrics": {"history": []}}))
    assert train(compose_train(conf, mistyped, common))["status"] == "completed"


def test_a_mistyped_rerun_keeps_the_earlier_runs_summary(conf, tmp_path):
    """A re-run in a finished run's directory that fails its checks prints the error and leaves that
    run's summary.json alone; a summary that only says an earlier attempt failed is replaced."""
    earlier = {"status": "completed", "start_time": 0.0, "steps": 1500, "metrics": {"final": {"val/acc": 0.99}}}
    (tmp_path / "summary.json").write_text(json.dumps(earlier))
    proc = cli(conf, tmp_path, ["optim.lr=-1"])
    assert proc.returncode == 2 and proc.stderr.startswith("error: optim.lr=-1.0")
    assert json.loads((tmp_path / "summary.json").read_text()) == earlier

    killed = tmp_path / "killed"  # killed mid-run: checkpoints and its settings, no summary yet
    (killed / "checkpoints").mkdir(parents=True)
    (killed / "checkpoints" / "step000500.ckpt").write_bytes(b"x")
    (killed / ".hydra").mkdir()
    (killed / ".hydra" / "overrides.yaml").write_text("- model.d_model=64\n")
    assert cli(conf, killed, ["optim.lr=-1", "resume=auto"]).returncode == 2
    assert not (killed / "summary.json").exists() and not (killed / ".hydra.pending").exists()
    assert (killed / ".hydra" / "overrides.yaml").read_text() == "- model.d_model=64\n"

    retry = tmp_path / "retry"
    assert cli(conf, retry, ["optim.lr=-1"]).returncode == 2
    assert cli(conf, retry, ["optim.weight_decay=-1"]).returncode == 2
    failed = json.loads((retry / "summary.json").read_text())
    assert failed["error"].startswith("ConfigError: optim.weight_decay=-1")  # the latest attempt's
    assert "optim.weight_decay=-1" in (retry / ".hydra" / "overrides.yaml").read_text()


def test_a_checkpoint_of_the_run_is_its_own_through_a_symlinked_directory(tmp_path):
    from omegaconf import OmegaConf

    from archlab.training.outputs import check_fresh

    real = tmp_path / "scratch" / "run1"
    (real / "checkpoints").mkdir(parents=True)
    (real / "checkpoints" / "step000005.ckpt").write_bytes(b"x")
    link = tmp_path / "run1"
    link.symlink_to(real)
    own = OmegaConf.create({"resume": None, "ckpt_path": str(real / "checkpoints" / "step000005.ckpt")})
    check_fresh(own, link, "hydra.run.dir")  # the same directory, reached through the link
    other = OmegaConf.create({"resume": None, "ckpt_path": str(tmp_path / "elsewhere.ckpt")})
    with pytest.raises(DirectoryHoldsRun, match="holds checkpoints"):
        check_fresh(other, link, "hydra.run.dir")


def test_newest_checkpoint_by_modification_time(tmp_path):
    from archlab.training.outputs import newest_checkpoint

    assert newest_checkpoint(tmp_path / "missing") is None
    for i, name in enumerate(["step000020.ckpt", "last.ckpt", "step000010.ckpt"]):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, ns=(10**18 + i * 10**9, [3, 1, 2][i] * 10**18))
    sharded = tmp_path / "step000030.ckpt"  # FSDP: a directory
    sharded.mkdir()
    os.utime(sharded, ns=(10**18, 2 * 10**18 + 1))
    assert newest_checkpoint(tmp_path) == tmp_path / "step000020.ckpt"


def test_failed_run_writes_a_failed_summary(conf, tmp_path):
    from archlab.training.run import train

    cfg = compose_train(
        conf, tmp_path, ["trainer.max_steps=20", "+callbacks.fail={_target_: helpers.training.FailAt, step: 3}"]
    )
    with pytest.raises(RuntimeError, match="planned failure"):
        train(cfg)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"] == "RuntimeError: planned failure at step 3"
    assert s["steps"] == 3 and s["paths"]["export"] is None and "planned failure" in s["traceback"]


@pytest.mark.parametrize(
    "override, field",
    [
        ("trainer.precision=fp8", "trainer.precision"),
        ("optim.lr=-1", "optim.lr"),
        ("optim.betas=[0.9,1.5]", "optim.betas"),
        ("scheduler.warmup_steps=5000", "scheduler.warmup_steps"),
        ("scheduler.min_lr_ratio=2", "scheduler.min_lr_ratio"),
        ("resume=newest", "resume"),
        ("ckpt_path=/nonexistent/x.ckpt", "ckpt_path"),
        ("trainer.strategy=horovod", "trainer.strategy"),
        ("trainer.max_steps=0", "trainer.max_steps"),
        ("model.attention.n_head=5", "model.attention.n_head"),
        ("callbacks.checkpoint.monitor=val/bleu", "callbacks.checkpoint.monitor"),
    ],
)
def test_bad_settings_raise_before_any_work(conf, tmp_path, override, field):
    from archlab.training.run import train

    with pytest.raises(ConfigError) as err:
        train(compose_train(conf, tmp_path, [override]))
    assert err.value.field == field
    assert not (tmp_path / "checkpoints").exists()


def test_fsdp_mesh_needs_a_device_count(conf, tmp_path):
    from archlab.training.run import train

    with pytest.raises(ConfigError) as err:
        train(compose_train(conf, tmp_path, ["trainer=fsdp", "trainer.devices=auto"]))
    assert err.value.field == "trainer.devices"


def test_cli_config_error_is_one_short_line(conf, tmp_path):
    proc = cli(conf, tmp_path / "run", ["trainer.precision=fp8"])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "error: trainer.precision='fp8' is invalid: allowed one of ['32', '32-true', 'bf16-mixed', 'bf16-true', '16-mixed', 'auto']"
    ]


def test_cli_type_error_from_the_structured_config(conf, tmp_path):
    proc = cli(conf, tmp_path / "run", ["trainer.max_steps=many"])
    assert proc.returncode != 0
    assert "trainer.max_steps" in proc.stderr and "many" in proc.stderr


def test_progress_is_rich_in_a_terminal_and_plain_otherwise(monkeypatch):
    from lightning.pytorch.callbacks import RichProgressBar

    from archlab.training.callbacks import PlainProgress, progress

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert isinstance(progress(), RichProgressBar)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert isinstance(progress(7), PlainProgress) and progress(7).every_n_steps == 7


def test_every_trainer_option_composes(conf, tmp_path):
    from hydra.utils import instantiate

    expect = {
        "cpu": ("cpu", 1, "auto"),
        "gpu": ("gpu", 1, "auto"),
        "ddp": ("gpu", 2, "ddp"),
        "ddp_spawn": ("auto", 2, "ddp_spawn"),
        "ddp_cpu": ("cpu", 2, "DDPStrategy"),
        "fsdp": ("auto", 2, "AtomicModelParallelStrategy"),
    }
    for name, (accelerator, devices, strategy) in expect.items():
        t = compose_train(conf, tmp_path, [f"trainer={name}"]).trainer
        assert (t.accelerator, t.devices) == (accelerator, devices)
        made = t.strategy if isinstance(t.strategy, str) else type(instantiate(t.strategy)).__name__
        assert made == strategy
    fsdp = instantiate(
        compose_train(conf, tmp_path, ["trainer=fsdp", "trainer.devices=4", "trainer.num_nodes=2"]).trainer.strategy
    )
    assert (fsdp._data_parallel_size, fsdp._tensor_parallel_size) == (8, 1)
    ddp_cpu = instantiate(compose_train(conf, tmp_path, ["trainer=ddp_cpu"]).trainer.strategy)
    assert ddp_cpu._process_group_backend == "gloo"


def test_launcher_configs_size_jobs_from_the_trainer(conf, tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_train(
        conf, tmp_path, ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=8", "trainer.num_nodes=2"]
    )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (2, 8, 8)
    local = compose_train(conf, tmp_path, ["hydra/launcher=local"]).hydra.launcher
    assert local._target_.endswith("JoblibLauncher") and local.n_jobs == 2


def test_default_config_composes_without_overrides():
    """``archlab-train`` with no arguments: nano on mqar, CPU, the tuned settings applied."""
    from archlab.build import compose

    cfg = compose("train", ["paths.output_dir=/unused"])
    assert cfg.data._target_.endswith("MQARDataModule") and cfg.trainer.accelerator == "cpu"
    assert cfg.trainer.strategy == "auto" and cfg.seed == 0 and cfg.ckpt_path is None
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.init_std, cfg.trainer.max_steps, cfg.threads) == (
        2,
        64,
        0.1,
        1500,
        1,
    )
    # Hydra writes each job's config files where archlab-train (and archlab-report) look for them first
    from archlab.run_files import PENDING_HYDRA_FILES

    hydra = compose("train", ["paths.output_dir=/unused"], return_hydra_config=True).hydra
    assert hydra.output_subdir == PENDING_HYDRA_FILES


def test_tuned_settings_apply_to_their_pair_only_and_keep_choices():
    from archlab.build import compose

    gpt2 = compose("train", ["model=gpt2"])  # another preset keeps its own sizes
    assert (gpt2.model.n_layer, gpt2.model.d_model, gpt2.model.init_std, gpt2.trainer.max_steps) == (
        12,
        768,
        0.02,
        2000,
    )
    rope = compose("train", ["model/position=rope"], return_hydra_config=True)  # a part swap keeps the tuned sizes
    assert rope.model.position.kind == "rope" and rope.model.n_layer == 2
    assert rope.hydra.runtime.choices["model/position"] == "rope"


@pytest.mark.slow  # the whole default run: about 1 minute on a quiet 2-core CPU, 2 at a load of 7
def test_default_run_learns_recall(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "archlab.cli.train", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["metrics"]["final"]["val/acc"] >= 0.9 and s["primary_metric"]["chance"] == 1 / 32
    assert "final val/acc: " in proc.stdout and "(chance 0.0312)" in proc.stdout


def test_bf16_mixed_precision_and_activation_checkpointing_train(conf, tmp_path):
    from archlab.training.run import train

    s = train(
        compose_train(
            conf,
            tmp_path,
            [
                "trainer.max_steps=20",
                "trainer.val_check_interval=20",
                "trainer.precision=bf16-mixed",
                "activation_checkpointing=true",
            ],
        )
    )
    assert s["status"] == "completed" and s["trainer"]["precision"] == "bf16-mixed"
    assert s["config"]["activation_checkpointing"] is True
    assert s["metrics"]["final"]["val/acc"] > 2 / 16  # above chance after 20 steps in bf16 autocast


@pytest.mark.slow  # torch.compile of each block costs ~30 s on this CPU
def test_compiled_blocks_train_like_eager_ones(conf, tmp_path):
    from archlab.training.run import train

    common = ["trainer.max_steps=10", "trainer.val_check_interval=10"]
    eager = train(compose_train(conf, tmp_path / "eager", common))
    compiled = train(compose_train(conf, tmp_path / "compiled", [*common, "compile=true"]))
    a = load_weights(tmp_path / "eager" / "model.safetensors").state_dict()
    b = load_weights(tmp_path / "compiled" / "model.safetensors").state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    assert abs(eager["metrics"]["final"]["val/loss"] - compiled["metrics"]["final"]["val/loss"]) < 1e-3


def test_which_trainers_rerun_the_command_line(conf, tmp_path):
    from archlab.training.validation import _relaunches_command

    expect = {"cpu": False, "gpu": False, "ddp": True, "ddp_spawn": False, "ddp_cpu": True, "fsdp": True}
    for name, relaunches in expect.items():
        assert _relaunches_command(compose_train(conf, tmp_path, [f"trainer={name}"]).trainer) is relaunches, name
    assert not _relaunches_command(compose_train(conf, tmp_path, ["trainer=ddp", "trainer.devices=1"]).trainer)


def test_a_local_sweep_refuses_a_trainer_that_reruns_the_command(conf, tmp_path):
    proc = cli(
        conf, tmp_path / "run", ["trainer=ddp_cpu", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], multirun=True
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("[job 0] error: trainer.strategy='lightning.pytorch.strategies.DDPStrategy'")
    )
    # the sweep stops at its first job, and its last line says so
    assert proc.stdout.splitlines()[-1] == f"0/1 completed, 1 failed — archlab-report {tmp_path / 'sweep'}"
    assert "ddp_spawn" in proc.stderr and not list((tmp_path / "sweep").glob("*/summary.json"))
