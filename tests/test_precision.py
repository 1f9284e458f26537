"""trainer.precision=auto: bf16 autocast where the CPU (or GPU) multiplies bf16 natively, float32
elsewhere; the choice and its reason are logged and recorded in summary.json."""

from __future__ import annotations

import json

import pytest

from archlab import precision
from archlab.precision import cpu_bf16_flags, resolve_precision

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


def test_trainer_cpu_asks_for_auto_and_the_run_records_what_it_used(tmp_path, monkeypatch):
    """trainer=cpu composes precision=auto; a run records the setting, what it used and why, and
    Lightning ran in the precision chosen."""
    from train_support import compose_train, tiny_config_dir

    from archlab.build import compose
    from archlab.training.run import train

    assert compose("train", ["data=text"]).trainer.precision == "auto"  # trainer=cpu, the default
    assert compose("train", []).trainer.precision == "32-true"  # the default nano-on-recall pair is too small for bf16
    monkeypatch.setattr(precision, "_native_cpu_bf16", lambda: ("avx512_bf16",))
    conf = tiny_config_dir(tmp_path / "conf")
    cfg = compose_train(
        conf, tmp_path / "run", ["trainer.precision=auto", "trainer.max_steps=8", "callbacks.samples=null"]
    )
    summary = train(cfg)
    recorded = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert recorded["precision"] == {
        "setting": "auto",
        "used": "bf16-mixed",
        "why": "auto: this CPU multiplies bf16 natively (avx512_bf16)",
    }
    assert summary["trainer"]["precision"] == "bf16-mixed"
