"""Each learning-rate schedule (scheduler=cosine|linear|constant|wsd) against hand-computed values, as
``LambdaLR`` steps it once per optimizer step, and the warm-up fitted to a short run for each."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from archlab.build import compose
from archlab.errors import ConfigError
from archlab.training.schedules import build_scheduler
from archlab.training.validation import validate_train

PEAK = 2e-3


def _lrs(scheduler: dict, max_steps: int, steps: int) -> list[float]:
    """The lr before each of ``steps`` optimizer steps."""
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=PEAK)
    sched = build_scheduler(opt, scheduler, max_steps)
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


# warm-up 4 steps: (step + 1) / 5 of the peak at steps 0..3
WARMUP = [PEAK * k / 5 for k in range(1, 5)]


def test_cosine():
    lrs = _lrs({"kind": "cosine", "warmup_steps": 4, "min_lr_ratio": 0.5, "decay_steps": 12}, 100, 14)
    # steps 4..11: cosine over 8 steps from 2e-3 to 1e-3: 1e-3 + 0.5e-3 * (1 + cos(pi * k / 8))
    assert lrs[:4] == pytest.approx(WARMUP, abs=1e-15)
    assert lrs[4] == pytest.approx(2e-3)
    assert lrs[6] == pytest.approx(1e-3 + 0.5e-3 * (1 + math.cos(math.pi / 4)))
    assert lrs[8] == pytest.approx(1.5e-3)  # half way: the mean of peak and floor
    assert lrs[12:] == pytest.approx([1e-3, 1e-3])


def test_linear():
    lrs = _lrs({"kind": "linear", "warmup_steps": 4, "min_lr_ratio": 0.25, "decay_steps": None}, 12, 14)
    # steps 4..11: from 2e-3 down by (2e-3 - 0.5e-3) / 8 = 1.875e-4 a step; 0.5e-3 from step 12 on
    assert lrs[:4] == pytest.approx(WARMUP, abs=1e-15)
    assert lrs[4:12] == pytest.approx([2e-3 - 1.875e-4 * k for k in range(8)], abs=1e-15)
    assert lrs[12:] == pytest.approx([5e-4, 5e-4], abs=1e-15)


def test_constant():
    lrs = _lrs({"kind": "constant", "warmup_steps": 4, "min_lr_ratio": None, "decay_steps": None}, 10, 12)
    assert lrs == pytest.approx([*WARMUP] + [PEAK] * 8, abs=1e-15)


def test_wsd_decays_with_one_minus_sqrt_over_its_last_fraction():
    s = {"kind": "wsd", "warmup_steps": 4, "min_lr_ratio": 0.1, "decay_steps": None, "decay_fraction": 0.25}
    lrs = _lrs(s, 20, 22)
    # 20 steps, the last 25% (5 steps) decay: the peak for steps 4..14, then at step 15 + k
    # 0.1 + 0.9 * (1 - sqrt(k / 5)) of it, the floor 0.1 from step 20 on
    assert lrs[:4] == pytest.approx(WARMUP, abs=1e-15)
    assert lrs[4:15] == pytest.approx([PEAK] * 11, abs=1e-15)
    decay = [PEAK * (0.1 + 0.9 * (1 - math.sqrt(k / 5))) for k in range(5)]
    assert lrs[15:20] == pytest.approx(decay, abs=1e-15)
    assert lrs[17] == pytest.approx(PEAK * (0.1 + 0.9 * (1 - math.sqrt(0.4))))
    assert lrs[20:] == pytest.approx([PEAK * 0.1] * 2, abs=1e-15)


def test_a_record_without_kind_is_cosine():
    """Checkpoints of earlier versions record a scheduler without ``kind``."""
    old = {"warmup_steps": 2, "min_lr_ratio": 0.1, "decay_steps": None}
    assert _lrs(old, 10, 11) == _lrs({**old, "kind": "cosine"}, 10, 11)


def _cfg(tmp_path, *overrides):
    """Composed as archlab-train composes it (with the Hydra node that says what the command line set)."""
    return compose(
        "train", [f"paths.output_dir={tmp_path}", "trainer.max_steps=10", *overrides], return_hydra_config=True
    )


@pytest.mark.parametrize("kind, fitted", [("cosine", 1), ("linear", 1), ("constant", 1), ("wsd", 1)])
def test_the_default_warmup_is_fitted_to_a_short_run_for_every_schedule(tmp_path, kind, fitted):
    cfg = validate_train(_cfg(tmp_path, f"scheduler={kind}"))
    assert cfg.scheduler.warmup_steps == fitted  # a tenth of trainer.max_steps=10


def test_wsd_warmup_is_fitted_before_its_decay_begins(tmp_path):
    """decay_fraction 0.95 of 20 steps: the decay begins at step 1, so the warm-up becomes 1, not 2."""
    cfg = validate_train(_cfg(tmp_path, "scheduler=wsd", "scheduler.decay_fraction=0.95", "trainer.max_steps=20"))
    assert cfg.scheduler.warmup_steps == 1


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["scheduler=constant", "scheduler.decay_steps=5"], "scheduler.decay_steps", "null: scheduler.kind=constant"),
        (["scheduler=constant", "scheduler.min_lr_ratio=0.1"], "scheduler.min_lr_ratio", "does not decay"),
        (["scheduler=wsd", "scheduler.decay_fraction=1.0"], "scheduler.decay_fraction", "strictly between 0 and 1"),
        (["scheduler=cosine", "scheduler.decay_fraction=0.2"], "scheduler.decay_fraction", "(wsd uses it)"),
        (["scheduler=linear", "scheduler.min_lr_ratio=null"], "scheduler.min_lr_ratio", "a number in [0, 1]"),
        (
            ["scheduler=wsd", "scheduler.warmup_steps=9"],
            "scheduler.warmup_steps",
            "at most 8: the warm-up must end before the decay over the last 2 of 10 steps",
        ),
    ],
)
def test_bad_schedule_settings_are_refused(tmp_path, overrides, field, says):
    with pytest.raises(ConfigError) as err:
        validate_train(_cfg(tmp_path, *overrides))
    assert err.value.field == field and says in str(err.value)
