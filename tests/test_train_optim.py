"""Optimizer groups and the learning-rate schedule, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from archlab import build_model, compose_model
from archlab.nn.loss import next_token_loss
from archlab.training.module import LitModel
from archlab.training.optim import build_optimizer, build_scheduler, lr_factor, param_groups

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

OPTIM = {
    "_target_": "torch.optim.AdamW",
    "_partial_": True,
    "lr": 1e-3,
    "betas": [0.9, 0.99],
    "eps": 1e-8,
    "weight_decay": 0.1,
}


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 1 / 11),  # warm-up: (step + 1) / (warmup + 1)
        (4, 5 / 11),
        (9, 10 / 11),
        (10, 1.0),  # cosine starts at the peak
        (35, 0.1 + 0.45 * (1 + math.cos(math.pi / 4))),  # a quarter of the way: cos(pi/4)
        (60, 0.55),  # half way: the mean of peak and floor
        (110, 0.1),  # the floor from decay_steps on
        (500, 0.1),
    ],
)
def test_lr_factor_at_hand_computed_steps(step, expected):
    assert lr_factor(step, warmup_steps=10, decay_steps=110, min_lr_ratio=0.1) == pytest.approx(expected, abs=1e-12)


def test_scheduler_steps_once_per_optimizer_step():
    p = nn.Parameter(torch.zeros(2, 2))
    opt = torch.optim.AdamW([p], lr=2e-3)
    sched = build_scheduler(opt, {"warmup_steps": 4, "min_lr_ratio": 0.5, "decay_steps": None}, max_steps=8)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up 1/5 .. 4/5 of 2e-3, then cosine over steps 4..8 from 2e-3 to 1e-3, then the floor
    cosine = [1e-3 + 0.5e-3 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    expected = [2e-3 * k / 5 for k in range(1, 5)] + cosine + [1e-3, 1e-3]
    assert seen == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=nano"],
        ["model=nano", "model/head=untied", "model/mlp=swiglu", "model/norm=rmsnorm", "model.head.bias=true"],
    ],
)
def test_weight_decay_only_on_matrices_and_tables(overrides):
    model = build_model(compose_model([*overrides, "model.n_layer=2", "model.d_model=32", "model.attention.n_head=2"]))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    # independent expectation from module types: Linear and Embedding weights decay; biases and norms do not
    expect_decay, expect_none = set(), set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            is_matrix = name == "weight" and isinstance(module, (nn.Linear, nn.Embedding))
            (expect_decay if is_matrix else expect_none).add(id(p))
    assert {id(p) for p in decay["params"]} == expect_decay
    assert {id(p) for p in no_decay["params"]} == expect_none
    unique = {id(p) for p in model.parameters()}  # a tied head appears once
    assert len(decay["params"]) + len(no_decay["params"]) == len(unique)


def test_adamw_uses_the_groups_and_is_fused_on_cpu():
    model = build_model(
        compose_model(["model=nano", "model.n_layer=1", "model.d_model=32", "model.attention.n_head=2"])
    )
    opt = build_optimizer(model, OPTIM, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"]
    assert not build_optimizer(model, OPTIM, torch.device("cpu"), mixed_precision=True).defaults["fused"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.defaults["betas"] == (0.9, 0.99) or list(opt.defaults["betas"]) == [0.9, 0.99]


def test_loss_scores_only_targets_that_are_not_minus_100():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, -100, 4], [-100, -100, 0]])
    picked = [(0, 0, 1), (0, 2, 4), (1, 2, 0)]
    expected = -sum(torch.log_softmax(logits[b, t], -1)[y] for b, t, y in picked) / 3
    assert next_token_loss(logits, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_activation_checkpointing_gives_the_same_gradients():
    cfg = {**_tiny_model(), "dropout": 0.0}
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        lit = LitModel(
            cfg,
            OPTIM,
            {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None},
            activation_checkpointing=recompute,
        )
        lit.configure_model()
        assert lit.model.activation_checkpointing is recompute
        idx = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(1))
        next_token_loss(lit(idx), idx.roll(-1, 1)).backward()
        grads.append({n: p.grad.clone() for n, p in lit.model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)


def test_hparams_are_plain_containers():
    lit = LitModel(
        _tiny_model(),
        OPTIM,
        {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None},
        val_names=["val", "val_long"],
    )
    hp = dict(lit.hparams)
    assert type(hp["model"]) is dict and type(hp["optim"]) is dict and list(hp["val_names"]) == ["val", "val_long"]


def _tiny_model() -> dict:
    from archlab.config import model_config_dict

    return model_config_dict(
        compose_model(
            [
                "model=nano",
                "model.n_layer=2",
                "model.d_model=32",
                "model.attention.n_head=2",
                "model.vocab_size=16",
                "model.context_length=8",
            ]
        )
    )


def test_a_non_finite_validation_batch_makes_the_validation_loss_non_finite():
    """A batch whose loss is NaN is not dropped from the token-weighted mean (which would report the
    mean of the other batches as the loss): the validation loss is NaN."""
    lit = LitModel(
        _tiny_model(), OPTIM, {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None}
    )
    lit.configure_model()
    lit.eval()
    x = torch.randint(16, (4, 8), generator=torch.Generator().manual_seed(0))
    y = x.roll(-1, 1)
    with torch.no_grad():
        lit.validation_step((x, y), 0)
        assert torch.isfinite(lit.val_loss["val"].compute())
        lit.val_loss["val"].reset()
        lit.validation_step((x, y), 0)
        lit.model.final_norm.weight.fill_(float("nan"))
        lit.validation_step((x, y), 1)
    assert torch.isnan(lit.val_loss["val"].compute())
