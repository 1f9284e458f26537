"""logger=mlflow and logger=wandb with the real libraries, offline: one short run logs its config, its
metrics and its final summary to both, read back from what each wrote to disk (MLflow's file store
through its client; W&B's offline run file through its record protobufs); a ``-m`` sweep's runs, one
after the other and in parallel, share one MLflow store in the sweep's directory and one W&B group."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from helpers.training import compose_train, tiny_config_dir

from archlab.errors import ConfigError
from archlab.training.loggers import wandb_mode

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

pytestmark = pytest.mark.usefixtures("single_thread")


def _offline(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """No W&B key, mode or server; no MLflow tracking server: everything stays on this disk."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(root / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # pytest captures the console itself
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(root / "wandb-config"))


@pytest.fixture
def offline(monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short run with both trackers, shared by the tests that read them."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _offline(monkeypatch, tmp_path_factory.mktemp("env"))
        yield _tracked_run(tmp_path_factory)


def _tracked_run(tmp_path_factory):
    from archlab.training.run import train

    conf = tiny_config_dir(tmp_path_factory.mktemp("conf"))
    out = tmp_path_factory.mktemp("tracked")
    overrides = [
        "logger=[mlflow,wandb]",
        "trainer.max_steps=4",
        "scheduler.warmup_steps=1",
        "trainer.val_check_interval=2",
        "trainer.log_every_n_steps=1",
        "callbacks.samples=null",
    ]
    summary = train(compose_train(conf, out, overrides))
    return out, summary


def test_mlflow_holds_the_config_metrics_and_summary(run):
    from mlflow import MlflowClient

    out, summary = run
    client = MlflowClient(f"file:{out / 'mlruns'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "archlab"]
    (found,) = client.search_runs([experiment.experiment_id])
    params = found.data.params
    assert params["trainer/max_steps"] == "4" and params["optim/kind"] == "adamw" and params["seed"] == "0"
    assert params["model/n_layer"] == str(summary["model"]["n_layer"])
    val = client.get_metric_history(found.info.run_id, "val/loss")
    expected = [(e["step"], e["val/loss"]) for e in summary["metrics"]["history"]]
    got = sorted((m.step, m.value) for m in val)
    assert [s for s, _ in got] == [s - 1 for s, _ in expected]  # Lightning's step: the last batch's index
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train/loss")] == [0, 1, 2, 3]
    assert found.data.metrics["summary/steps"] == 4
    assert found.data.metrics["summary/final/val/loss"] == pytest.approx(summary["metrics"]["final"]["val/loss"])
    assert found.data.tags["summary/status"] == "completed" and found.info.status == "FINISHED"
    artifact = Path(client.download_artifacts(found.info.run_id, "summary.json", str(out / "download")))
    assert json.loads(artifact.read_text()) == summary
    assert str(out / "mlruns" / experiment.experiment_id / found.info.run_id) in summary["paths"]["logs"]


def _records(path: Path):
    """The protobuf records of a W&B run file (a LevelDB-style log: 7-byte file header, 32 KiB blocks of
    chunks, each with a 7-byte header: crc32, length, type FULL=1 | FIRST=2 | MIDDLE=3 | LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_config_metrics_and_summary(run):
    out, summary = run
    (run_dir,) = (out / "wandb").glob("offline-run-*")  # offline: no key, no WANDB_MODE
    assert str(run_dir) in summary["paths"]["logs"]
    config, history, final = {}, [], {}
    for record in _records(next(run_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            final.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in record.summary.update})
    assert config["trainer"]["max_steps"] == 4 and config["optim"]["kind"] == "adamw"
    assert config["model"]["n_layer"] == summary["model"]["n_layer"]
    val = [(h["trainer/global_step"], h["val/loss"]) for h in history if "val/loss" in h]
    assert [s for s, _ in val] == [e["step"] - 1 for e in summary["metrics"]["history"]]
    assert [v for _, v in val] == pytest.approx([e["val/loss"] for e in summary["metrics"]["history"]], rel=1e-6)
    assert final["summary/status"] == "completed" and final["summary/steps"] == 4
    assert final["summary/final/val/loss"] == pytest.approx(summary["metrics"]["final"]["val/loss"])
    saved = run_dir / "files" / "summary.json"
    assert json.loads(saved.read_text()) == summary


@pytest.mark.parametrize(
    "env, key, mode, expected",
    [
        ({}, False, None, "offline"),
        ({}, True, None, "online"),
        ({"WANDB_MODE": "disabled"}, True, None, "disabled"),
        ({"WANDB_MODE": "online"}, False, None, "online"),
        ({}, True, "offline", "offline"),
    ],
)
def test_wandb_mode_is_offline_unless_logged_in(offline, monkeypatch, tmp_path, env, key, mode, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if key:  # what `wandb login` writes
        netrc = tmp_path / "netrc"
        netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_mode(mode) == expected


def test_a_bad_wandb_mode_is_refused(offline):
    with pytest.raises(ConfigError) as err:
        wandb_mode("cloud")
    assert err.value.field == "logger.wandb.mode"


@pytest.mark.parametrize("launcher", ["basic", "local"])
def test_a_sweeps_runs_share_one_store_named_and_tagged_by_their_overrides(offline, monkeypatch, tmp_path, launcher):
    """`-m seed=0,1` with mlflow and wandb, one job after the other (Hydra's basic launcher) and in
    parallel (hydra/launcher=local, joblib): one MLflow store in the sweep's directory with one experiment
    and a run per job, named by the job's overrides and tagged with each; each W&B run in the sweep's group."""
    from helpers.training import cli
    from mlflow import MlflowClient

    sweep = tmp_path / "m"
    wandb = launcher == "basic"  # the same code names the W&B runs under either launcher: once is enough
    loggers = "logger=[csv,mlflow,wandb]" if wandb else "logger=[csv,mlflow]"
    overrides = ["seed=0,1", loggers, "trainer.max_steps=6", "trainer.val_check_interval=6"]
    overrides += ["callbacks.samples=null", f"hydra.sweep.dir={sweep}"]
    overrides += ["hydra/launcher=local"] if launcher == "local" else []  # 2 jobs at once
    done = cli(tiny_config_dir(tmp_path / "conf"), tmp_path / "unused", overrides, multirun=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(sweep.glob("*/mlruns")) and not (tmp_path / "unused").exists()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
    client = MlflowClient(f"file:{sweep / 'mlruns'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "archlab"]
    runs = client.search_runs([experiment.experiment_id])
    names = [  # Hydra's override_dirname (sorted), at most 250 characters as a database store keeps them
        f"callbacks.samples=null,data=tiny,{loggers},model.attention.n_head=2,model.d_model=32,model.n_layer=1,"
        f"scheduler.warmup_steps=5,seed={s},trainer.log_every_n_steps=10,trainer.max_steps=6,"
        "trainer.precision=32-true,trainer.val_check_interval=6"
        for s in (0, 1)
    ]
    assert sorted(str(r.info.run_name) for r in runs) == [name[:250] for name in names]
    for job in (0, 1):
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        (found,) = [r for r in runs if r.info.run_id in " ".join(summary["paths"]["logs"])]
        tags = found.data.tags
        assert tags["seed"] == str(job) and tags["model.d_model"] == "32" and f"logger={tags['logger']}" == loggers
        assert tags["sweep"] == str(sweep) and found.data.params["seed"] == str(job)
        assert found.data.tags["summary/status"] == "completed" and found.info.status == "FINISHED"
        if not wandb:
            continue
        (run_dir,) = (sweep / str(job) / "wandb").glob("offline-run-*")
        (run,) = [r.run for r in _records(next(run_dir.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run"]
        assert run.run_group == str(sweep) and run.display_name[:250] == found.info.run_name


def test_a_run_leaves_the_next_run_in_this_process_its_own_store(offline, tmp_path):
    """MLflow's ``set_tracking_uri`` exports ``MLFLOW_TRACKING_URI``: a first run's store must not become
    every later run's (a sweep's next job, or a second ``train`` call)."""
    from archlab.training.loggers import MLFlowLogger

    first = MLFlowLogger(save_dir=str(tmp_path / "a"))
    assert first.experiment is not None and first.run_id
    assert "MLFLOW_TRACKING_URI" not in os.environ
    second = MLFlowLogger(save_dir=str(tmp_path / "b"))
    assert second.run_id and second.log_dir.startswith(str(tmp_path / "b"))
    first.finalize("success")
    second.finalize("success")
