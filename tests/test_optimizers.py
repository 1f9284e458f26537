"""The optimizers (optim=adamw|sgd|muon): which tensors each updates with which weight decay, one step
against hand-computed updates, Muon's step against a reference Newton-Schulz, and an exact resume of the
combined Muon + AdamW optimizer, alone and through a real checkpointed run."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.training import compose_train, tiny_config_dir
from torch import nn

from archlab import build_model, compose_model
from archlab.build import compose
from archlab.errors import ConfigError
from archlab.nn.loss import next_token_loss
from archlab.training.optim import MuonAdamW, build_optimizer
from archlab.training.validation import validate_train
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")
ADAMW = {"kind": "adamw", "lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}
SGD = {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.01}
MUON = {
    "kind": "muon",
    "lr": 1e-2,
    "weight_decay": 0.1,
    "momentum": 0.95,
    "nesterov": True,
    "ns_steps": 5,
    "adjust_lr_fn": "match_rms_adamw",
    "betas": [0.9, 0.99],
    "eps": 1e-8,
    "adamw_lr": 3e-3,
}


def _model(*overrides: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = compose_model(["model=nano", "model.n_layer=2", "model.d_model=32", "model.attention.n_head=2", *overrides])
    return build_model(cfg)


def _backward(model: nn.Module, seed: int = 1) -> None:
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))
    model.zero_grad()
    next_token_loss(model(idx), idx.roll(-1, 1)).backward()


def _kinds(model: nn.Module) -> tuple[set[int], set[int], set[int]]:
    """Independently of names: Linear weights inside the blocks (hidden matrices), the other Linear and
    Embedding weights (tables and head), and the rest (biases, norm scales)."""
    hidden, tables, rest = set(), set(), set()
    blocks = {id(m) for m in model.blocks.modules()}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if name == "weight" and isinstance(module, nn.Linear) and id(module) in blocks:
                hidden.add(id(p))
            elif name == "weight" and isinstance(module, (nn.Linear, nn.Embedding)):
                tables.add(id(p))
            else:
                rest.add(id(p))
    return hidden, tables, rest


def _ids(group: dict) -> set[int]:
    return {id(p) for p in group["params"]}


@pytest.mark.parametrize("optim", [ADAMW, SGD])
def test_adamw_and_sgd_decay_matrices_and_tables_only(optim):
    model = _model("model/head=untied")
    opt = build_optimizer(model, optim, CPU)
    hidden, tables, rest = _kinds(model)
    decay, no_decay = opt.param_groups
    assert (_ids(decay), decay["weight_decay"]) == (hidden | tables, optim["weight_decay"])
    assert (_ids(no_decay), no_decay["weight_decay"]) == (rest, 0.0)
    assert opt.defaults["fused"] and not build_optimizer(model, optim, CPU, mixed_precision=True).defaults["fused"]


def test_adamw_first_step_by_hand():
    """Step 1 of AdamW: bias-corrected moments are g and g**2, so p <- p(1 - lr wd) - lr g / (|g| + eps)."""
    model = _model()
    opt = build_optimizer(model, ADAMW, CPU)
    _backward(model)
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    opt.step()
    lr, wd, eps = ADAMW["lr"], ADAMW["weight_decay"], ADAMW["eps"]
    for name, p in model.named_parameters():
        p0, g = before[name]
        decay = wd if p.dim() >= 2 else 0.0
        torch.testing.assert_close(p.detach(), p0 * (1 - lr * decay) - lr * g / (g.abs() + eps), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_two_steps_by_hand(nesterov):
    """Same gradient twice, L2 decay on matrices: buf1 = g1, buf2 = mu buf1 + g2; the step is buf (heavy
    ball) or g + mu buf (Nesterov), times lr, where g = grad + wd p."""
    model = _model()
    cfg = {**SGD, "nesterov": nesterov}
    opt = build_optimizer(model, cfg, CPU)
    lr, mu, wd = cfg["lr"], cfg["momentum"], cfg["weight_decay"]
    _backward(model)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    expected, bufs = {}, {}
    for name, p in model.named_parameters():
        w, decay = p.detach().clone(), (wd if p.dim() >= 2 else 0.0)
        for step in range(2):
            g = grads[name] + decay * w
            bufs[name] = g if step == 0 else mu * bufs[name] + g
            w = w - lr * (g + mu * bufs[name] if nesterov else bufs[name])
        expected[name] = w
    for _ in range(2):
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opt.step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("head", ["tied", "untied"])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(head):
    model = _model(f"model/head={head}", "model/mlp=swiglu")
    opt = build_optimizer(model, MUON, CPU)
    assert isinstance(opt, MuonAdamW)
    hidden, tables, rest = _kinds(model)
    (muon,) = opt.muon.param_groups
    decay, no_decay = opt.adamw.param_groups
    assert _ids(muon) == hidden and muon["weight_decay"] == MUON["weight_decay"] and muon["lr"] == MUON["lr"]
    assert _ids(decay) == tables and decay["weight_decay"] == MUON["weight_decay"]
    assert _ids(no_decay) == rest and no_decay["weight_decay"] == 0.0
    assert decay["lr"] == no_decay["lr"] == MUON["adamw_lr"]
    assert opt.param_groups == [muon, decay, no_decay]  # one list, the very group dicts: the schedule sees all
    unique = {id(p) for p in model.parameters()}  # a tied head is listed once
    assert sum(len(g["params"]) for g in opt.param_groups) == len(unique)


def _newton_schulz(g: torch.Tensor, steps: int) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration (modded-nanogpt, 2024), here in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).float()


def test_muon_first_step_against_a_reference_newton_schulz():
    """Step 1: the momentum buffer is (1 - mu) g and Nesterov's mix of it with g a multiple of g, so the
    update orthogonalises g itself; p <- p(1 - lr wd) - 0.2 lr sqrt(max(A, B)) NS(g) (match_rms_adamw).
    Full-rank gradients: torch iterates in bfloat16, whose rounding NS would blow up along the null space
    of a low-rank one (a 16-token batch's); on these it is within 2% of the float64 iteration."""
    model = _model()
    opt = build_optimizer(model, MUON, CPU)
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    hidden, _, _ = _kinds(model)
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    opt.step()
    lr, wd, eps = MUON["lr"], MUON["weight_decay"], MUON["eps"]
    for name, p in model.named_parameters():
        p0, g = before[name]
        if id(p) in hidden:
            A, B = p.shape
            scale = 0.2 * lr * math.sqrt(max(A, B))
            update = (p0 * (1 - lr * wd) - p.detach()) / scale
            reference = _newton_schulz(g, 5)
            assert ((update - reference).norm() / reference.norm()).item() < 0.03, name
            assert (update - reference).abs().max().item() < 0.03, name
            # orthogonalised: every singular value in the quintic's band around 1 (g's spread far wider)
            sv = torch.linalg.svdvals(update)
            assert 0.6 < sv.min() and sv.max() < 1.25, name
        else:
            lr_a, decay = MUON["adamw_lr"], (wd if p.dim() >= 2 else 0.0)
            expected = p0 * (1 - lr_a * decay) - lr_a * g / (g.abs() + eps)
            torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-7)


def test_muon_adamw_state_saves_and_resumes_exactly(tmp_path):
    """Three steps, the optimizer and schedule saved (loadable with weights_only=True), then two more in a
    fresh optimizer: bit-identical to five uninterrupted steps."""
    from archlab.training.schedules import build_scheduler

    sched_cfg = {"kind": "wsd", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None, "decay_fraction": 0.4}

    def run(model, opt, sched, steps, start):
        for k in range(start, start + steps):
            _backward(model, seed=10 + k)
            opt.step()
            sched.step()

    straight = _model()
    opt = build_optimizer(straight, MUON, CPU)
    run(straight, opt, build_scheduler(opt, sched_cfg, 5), 5, 0)

    first = _model()
    opt = build_optimizer(first, MUON, CPU)
    sched = build_scheduler(opt, sched_cfg, 5)
    run(first, opt, sched, 3, 0)
    torch.save({"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "c.pt")

    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    opt = build_optimizer(resumed, MUON, CPU)
    sched = build_scheduler(opt, sched_cfg, 5)
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    assert opt.muon.state is opt.state and opt.adamw.state is opt.state  # the loaded state is the one stepped
    run(resumed, opt, sched, 2, 3)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_muon_run_resumes_exactly_from_its_checkpoint(tmp_path_factory):
    """Through Lightning: a run resumed from its step-3 checkpoint ends bit-identical to the straight run."""
    from archlab.training.run import train

    conf = tiny_config_dir(tmp_path_factory.mktemp("conf"))
    root = tmp_path_factory.mktemp("muon")
    common = [
        "optim=muon",
        "scheduler=wsd",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "callbacks.checkpoint.save_top_k=-1",
        "callbacks.samples=null",
    ]
    full = train(compose_train(conf, root / "full", common))
    mid = root / "full" / "checkpoints" / "step000003.ckpt"
    resumed = train(compose_train(conf, root / "resumed", [*common, f"ckpt_path={mid}"]))
    assert resumed["metrics"]["history"] == full["metrics"]["history"]
    a = load_weights(root / "full" / "model.safetensors").state_dict()
    b = load_weights(root / "resumed" / "model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["optim.kind=adam"], "optim.kind", "one of ['adamw', 'sgd', 'muon']"),
        (["optim.momentum=0.9"], "optim.momentum", "null: optim.kind=adamw does not use it (optim=sgd|muon does)"),
        (["optim=sgd", "optim.betas=[0.9,0.95]"], "optim.betas", "null: optim.kind=sgd does not use it"),
        (["optim=sgd", "optim.momentum=null"], "optim.momentum", "a value: optim.kind=sgd needs it"),
        (["optim=sgd", "optim.momentum=1.0"], "optim.momentum", "a number in [0, 1)"),
        (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], "optim.nesterov", "Nesterov's step needs"),
        (["optim=muon", "optim.ns_steps=0"], "optim.ns_steps", "a positive integer"),
        (["optim=muon", "optim.adjust_lr_fn=keller"], "optim.adjust_lr_fn", "['original', 'match_rms_adamw']"),
        (["optim=muon", "optim.adamw_lr=0"], "optim.adamw_lr", "a positive number, or null"),
        (["optim=muon", "trainer=fsdp"], "optim.kind", "adamw or sgd under a sharded trainer"),
    ],
)
def test_bad_optimizer_settings_are_refused(tmp_path, overrides, field, says):
    cfg = compose("train", [f"paths.output_dir={tmp_path}", *overrides], return_hydra_config=True)
    with pytest.raises(ConfigError) as err:
        validate_train(cfg)
    assert err.value.field == field and says in str(err.value)


@pytest.mark.parametrize("kind", ["adamw", "sgd", "muon"])
def test_each_option_file_passes_validation(tmp_path, kind):
    cfg = validate_train(compose("train", [f"paths.output_dir={tmp_path}", f"optim={kind}"], return_hydra_config=True))
    assert cfg.optim.kind == kind


def test_moe_stacked_experts_decay_their_matrices_not_their_biases_and_stay_with_adamw_under_muon():
    """Stacked routed experts: matrices [E, out, in] decay, biases [E, out] (2-D, yet biases) do not; under
    Muon (2-D parameters only) both go to AdamW, and the router, a Linear in the blocks, to Muon."""
    from archlab.nn.moe import Experts

    model = _model("model/mlp=moe", "model.mlp.routing.n_experts=4", "model.mlp.bias=true")
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    stacked_w = {id(p) for m in experts for n, p in m.named_parameters() if p.dim() == 3}
    stacked_b = {id(p) for m in experts for n, p in m.named_parameters() if p.dim() == 2}
    assert len(stacked_w) == len(stacked_b) == 2 * len(experts) > 0
    hidden, tables, rest = _kinds(model)  # Linear weights (routers) / tables / the rest, stacked ones included
    decay, no_decay = build_optimizer(model, ADAMW, CPU).param_groups
    assert _ids(decay) == hidden | tables | stacked_w
    assert _ids(no_decay) == rest - stacked_w
    opt = build_optimizer(model, MUON, CPU)
    (muon,) = opt.muon.param_groups
    adam_decay, adam_no_decay = opt.adamw.param_groups
    assert _ids(muon) == hidden and {id(m.router.weight) for m in model.modules() if hasattr(m, "router")} <= hidden
    assert _ids(adam_decay) == tables | stacked_w and stacked_b <= _ids(adam_no_decay)
