"""trainer.precision=auto: bf16 autocast where the CPU (or GPU) multiplies bf16 natively, float32
elsewhere; the choice and its reason are logged and recorded in summary.json. And the device settings
a command accepts on this machine."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import archlab.errors
from archlab import precision
from archlab.errors import ConfigError
from archlab.precision import check_device, cpu_bf16_flags, resolve_precision

XEON = """processor\t: 0
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
processor\t: 1
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""
OLD_XEON = "processor\t: 0\nflags\t\t: fpu sse sse2 avx2 avx512f avx512bw avx512vl\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, flags",
    [(XEON, ["amx_bf16", "avx512_bf16"]), (OLD_XEON, []), (GRAVITON3, ["bf16"]), (None, [])],
    ids=["sapphire-rapids", "skylake", "graviton3", "no-cpuinfo"],
)
def test_cpu_bf16_flags(tmp_path, cpuinfo, flags):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    assert cpu_bf16_flags(path) == flags


def test_auto_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(precision, "_native_cpu_bf16", lambda: ("amx_bf16", "avx512_bf16"))
    used, why = resolve_precision("auto", "cpu")
    assert used == "bf16-mixed" and "amx_bf16, avx512_bf16" in why
    monkeypatch.setattr(precision, "_native_cpu_bf16", lambda: ())
    assert resolve_precision("auto", "cpu")[0] == "32-true"
    assert resolve_precision("32-true", "cpu") == ("32-true", "as set by trainer.precision")
    assert resolve_precision("bf16-mixed", "cpu")[0] == "bf16-mixed"


def test_auto_on_a_cpu_keeps_float32_for_a_narrow_model(monkeypatch):
    """Below d_model 256 bf16 autocast gains nothing on a CPU (docs/performance.md): float32, and the
    reason names the width; from 256 on, and on a GPU whatever the width, bf16."""
    monkeypatch.setattr(precision, "_native_cpu_bf16", lambda: ("avx512_bf16",))
    used, why = resolve_precision("auto", "cpu", d_model=128)
    assert used == "32-true" and "d_model=128 (< 256)" in why and "avx512_bf16" in why
    assert resolve_precision("auto", "cpu", d_model=256) == (
        "bf16-mixed",
        "auto: this CPU multiplies bf16 natively (avx512_bf16)",
    )
    assert resolve_precision("bf16-mixed", "cpu", d_model=64)[0] == "bf16-mixed"  # as set
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", "gpu", d_model=64)[0] == "bf16-mixed"


def test_trainer_cpu_asks_for_auto_and_the_run_records_what_it_used(tmp_path, monkeypatch):
    """trainer=cpu composes precision=auto; a run records the setting, what it used and why, and
    Lightning ran in the precision chosen."""
    from helpers.training import compose_train, tiny_config_dir

    from archlab.build import compose
    from archlab.training.run import train

    assert compose("train", ["data=text"]).trainer.precision == "auto"  # trainer=cpu, the default
    assert compose("train", []).trainer.precision == "32-true"  # the default nano-on-recall pair is too small for bf16
    monkeypatch.setattr(precision, "_native_cpu_bf16", lambda: ("avx512_bf16",))
    conf = tiny_config_dir(tmp_path / "conf")
    cfg = compose_train(
        conf,
        tmp_path / "run",
        ["trainer.precision=auto", "trainer.max_steps=8", "callbacks.samples=null", "model.d_model=256"],
    )
    summary = train(cfg)
    recorded = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert recorded["precision"] == {
        "setting": "auto",
        "used": "bf16-mixed",
        "why": "auto: this CPU multiplies bf16 natively (avx512_bf16)",
    }
    assert summary["trainer"]["precision"] == "bf16-mixed"


def test_the_exceptions_module_probes_no_hardware():
    """archlab.errors holds the exception types only: the device check, which asks torch about this
    machine, sits in archlab.precision beside the other hardware probes."""
    tree = ast.parse(Path(archlab.errors.__file__).read_text(encoding="utf-8"))
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.split(".")[0] == "torch" for name in imported), imported
    assert not hasattr(archlab.errors, "check_device")


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu"])
def test_device_settings_this_machine_can_run_on(monkeypatch, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    check_device("cpu")
    check_device("auto", auto=True)
    for name, auto, allowed in [
        ("tpu", False, "cpu, cuda or cuda:<index>"),
        ("meta", True, "auto, cpu, cuda or cuda:<index>"),
        ("cuda:x", True, "auto, cpu, cuda or cuda:<index>"),
        ("auto", False, "cpu, cuda or cuda:<index>"),  # auto only where the command allows it
    ]:
        with pytest.raises(ConfigError) as err:
            check_device(name, auto=auto)
        assert (err.value.field, err.value.value, err.value.allowed) == ("device", name, allowed)
    for name, auto in [("cuda", False), ("cuda:1", True)]:
        if gpu:
            check_device(name, auto=auto)
        else:
            with pytest.raises(ConfigError) as err:
                check_device(name, auto=auto)
            assert err.value.allowed == f"{'auto or ' if auto else ''}cpu: this machine has no CUDA GPU"
