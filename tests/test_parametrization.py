"""param=mup|completep (archlab/training/parametrization.py): the multipliers against values worked out by hand
from the papers' tables, the identity at the proxy's own size, every preset's parameters given a role, the
refusals, the coordinate check's slopes, and the optimizer's state through a resume; two processes
(DDP, FSDP2) and a resume from a sharded checkpoint under -m slow."""

from __future__ import annotations

import copy
import json
import math
from typing import Any, cast

import pytest
import torch
from helpers.report_runs import job
from helpers.training import cli, compose_train

from archlab import compose_model
from archlab.build import build_model, compose
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.model import Decoder
from archlab.report.proxy import transfer_lr, transferred
from archlab.training.coordcheck import coordinate_check
from archlab.training.optim import build_optimizer, param_groups
from archlab.training.parametrization import check_param, initialise, parametrize, roles
from archlab.training.validation import validate_train
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")

OPTIM = {"kind": "adamw", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], "eps": 1e-8}
CPU = torch.device("cpu")


def _param(kind: str, base_d_model=None, base_n_layer=None, base_head_dim=None) -> dict:
    return {"kind": kind, "base_d_model": base_d_model, "base_n_layer": base_n_layer, "base_head_dim": base_head_dim}


def _model(*overrides: str):
    return compose_model(["model=nano", "model.vocab_size=32", "model.context_length=16", *overrides])


def _groups_by_name(model: Decoder, optimizer: torch.optim.Optimizer) -> dict[str, tuple[float, float, float]]:
    """parameter name -> (lr, weight_decay, eps) of the group holding it."""
    of = {id(p): (g["lr"], g["weight_decay"], g["eps"]) for g in optimizer.param_groups for p in g["params"]}
    return {n: of[id(p)] for n, p in model.named_parameters()}


def test_at_the_proxys_own_size_mup_and_completep_are_sp():
    cfg = _model("model.d_model=64", "model.n_layer=3")
    for param in (_param("mup", 64), _param("completep", 64, 3)):
        assert parametrize(cfg, param) == cfg
        torch.manual_seed(0)
        reference = build_model(cfg)
        torch.manual_seed(0)
        model = build_model(parametrize(cfg, param))  # as training builds it: GPT-2's init, then the rules
        initialise(model, param)
        for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
        sp = build_optimizer(reference, OPTIM, CPU)
        mup = build_optimizer(model, OPTIM, CPU, param=param)
        eps = {id(p): OPTIM["eps"] for g in sp.param_groups for p in g["params"]}
        sp_groups = {n: (OPTIM["lr"], wd, eps[id(p)]) for n, p, wd in _named_decay(reference)}
        assert _groups_by_name(model, mup) == sp_groups


def _named_decay(model: Decoder):
    groups = param_groups(model, OPTIM["weight_decay"])
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    return [(n, p, decay[id(p)]) for n, p in model.named_parameters()]


def test_completep_multipliers_match_the_papers_rules_worked_by_hand():
    """d_model 128 over a proxy of 32 (m = 4), 4 layers over 2 (l = 2), a MoE MLP (its router an output),
    learned positions: Yang et al. 2022 Table 3 and Dey et al. 2025 Table 1 / nanoGPT-mup's CompleteP."""
    cfg = _model("model.d_model=128", "model.n_layer=4", "model.attention.n_head=4", "model/mlp=moe")
    param = _param("completep", 32, 2)
    scaled = parametrize(cfg, param)
    assert scaled.head.logit_scale == 0.25  # logits × 1/m
    assert scaled.block.residual_multiplier == 0.5  # each branch × 1/l
    # head dim 32 at d_model 128, 8 at the proxy's 32 (4 heads): 1/sqrt(32) × sqrt(8/32) = sqrt(8)/32
    assert scaled.attention.scale == pytest.approx(math.sqrt(8) / 32, rel=1e-12)
    model = Decoder(scaled)
    groups = _groups_by_name(model, build_optimizer(model, OPTIM, CPU, param=param))
    lr, wd, eps = OPTIM["lr"], OPTIM["weight_decay"], OPTIM["eps"]
    expected = {
        "tok_emb.weight": (lr, wd, eps / 4),  # input: lr and decay kept, eps / m
        "position.table.weight": (lr, wd, eps / 4),
        "blocks.0.attn.qkv.weight": (lr / 4, wd * 4, eps / 8),  # hidden: lr / m, decay × m, eps / (m l)
        "blocks.3.attn.proj.weight": (lr / 4, wd * 4, eps / 8),
        "blocks.1.mlp.experts.gate_up": (lr / 4, wd * 4, eps / 8),
        "blocks.1.mlp.router.weight": (lr / 4, wd * 4, eps / 8),  # output: as hidden for Adam's lr
        "blocks.2.attn_norm.weight": (lr, 0.0, eps / 8),  # vector inside a block: lr kept, no decay
        "final_norm.weight": (lr, 0.0, eps / 4),
    }
    for name, want in expected.items():
        assert groups[name] == pytest.approx(want, rel=1e-12), name


def test_mup_keeps_the_weight_decay_and_the_depth():
    cfg = _model("model.d_model=128", "model.n_layer=4", "model.attention.n_head=4")
    param = _param("mup", 32)
    assert parametrize(cfg, param).block.residual_multiplier == 1.0
    model = Decoder(parametrize(cfg, param))
    groups = _groups_by_name(model, build_optimizer(model, OPTIM, CPU, param=param))
    assert groups["blocks.0.mlp.fc.weight"] == pytest.approx((1e-3 / 4, 0.1, 1e-8 / 4))


def test_init_scales_each_role_by_its_rule():
    """hidden std × 1/sqrt(m), output × 1/m, inputs as GPT-2; completep's residual projections count the
    proxy's depth: std 0.02/sqrt(2·1)/sqrt(m) at 4 layers over a 1-layer proxy."""
    cfg = _model("model.d_model=256", "model.n_layer=4", "model.attention.n_head=4", "model/mlp=moe")
    cfg = parametrize(cfg, _param("completep", 64, 1))
    torch.manual_seed(0)
    model = build_model(cfg)
    initialise(model, _param("completep", 64, 1))
    std = {n: p.std().item() for n, p in model.named_parameters()}
    assert std["tok_emb.weight"] == pytest.approx(0.02, rel=0.05)
    assert std["blocks.0.attn.qkv.weight"] == pytest.approx(0.02 / 2, rel=0.05)
    assert std["blocks.0.attn.proj.weight"] == pytest.approx(0.02 / math.sqrt(2) / 2, rel=0.05)
    assert std["blocks.0.mlp.experts.down"] == pytest.approx(0.02 / math.sqrt(2) / 2, rel=0.05)
    assert std["blocks.0.mlp.router.weight"] == pytest.approx(0.02 / 4, rel=0.1)


def test_residual_init_depth_fixes_the_residual_projections_init():
    """GPT-2's init at 8 layers: the residual projections at 0.02/sqrt(16), the rest 0.02; with
    model.residual_init_depth=2 they are 0.02/sqrt(4) at any depth; completep refuses the field."""
    stds = {}
    for fixed in ("null", "2"):
        cfg = _model(
            "model.d_model=128", "model.n_layer=8", "model.attention.n_head=4", f"model.residual_init_depth={fixed}"
        )
        torch.manual_seed(0)
        stds[fixed] = {n: p.std().item() for n, p in build_model(cfg).named_parameters()}
    for name in ("blocks.7.attn.proj.weight", "blocks.7.mlp.proj.weight"):
        assert stds["null"][name] == pytest.approx(0.02 / 4, rel=0.05)
        assert stds["2"][name] == pytest.approx(0.02 / 2, rel=0.05)
    assert stds["2"]["blocks.7.attn.qkv.weight"] == pytest.approx(0.02, rel=0.05)
    cfg = _model("model.d_model=128", "model.n_layer=8", "model.attention.n_head=4", "model.residual_init_depth=2")
    with pytest.raises(ConfigError, match="null under param.kind=completep"):
        check_param(_param("completep", 64, 2), cfg, "adamw")


# every preset's parameters are checked for a role in tests/test_presets.py, beside their count; here the
# parts no preset holds, and the role each shape implies
VARIANTS = [
    ["model=deepseek-v3"],
    ["model=qwen3-next-80b-a3b"],
    ["model=gpt2"],
    ["model=nano", "model/attention=gated_deltanet"],
    ["model=nano", "model/attention=mamba2", "model/mlp=none"],
    ["model=nano", "model.attention.gate=head", "model.attention.sinks=true", "model.attention.qkv_bias=true"],
    ["model=nano", "model.attention.gate=elementwise", "model.embedding_dim=32", "model.head.tied=false"],
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: " ".join(o))
def test_every_parameter_has_the_role_its_shape_implies(overrides):
    with torch.device("meta"):
        model = Decoder(compose_model(overrides))
    found = roles(model)
    params = {id(p): (n, p) for n, p in model.named_parameters()}
    assert set(found) == set(params)
    for key, (name, p) in params.items():
        if p.dim() == 1:  # by shape alone: a bias, a scale, one value per channel or head
            assert found[key] is Role.VECTOR, name
        if found[key] is Role.INPUT:
            assert name in ("tok_emb.weight", "position.table.weight", "head.weight"), name


def test_a_part_that_declares_no_role_is_refused_by_name(monkeypatch):
    cfg = _model()
    monkeypatch.setattr(CausalSelfAttention, "param_roles", lambda self: {"proj.weight": Role.HIDDEN})
    with pytest.raises(ConfigError, match=r"CausalSelfAttention \(blocks\.0\.attn\).*qkv\.weight"):
        check_param(_param("mup", 32), cfg, "adamw")
    monkeypatch.setattr(CausalSelfAttention, "param_roles", lambda self: None)
    with pytest.raises(ConfigError, match=r"CausalSelfAttention.*declares no μP roles"):
        check_param(_param("mup", 32), cfg, "adamw")
    check_param(_param("sp"), cfg, "adamw")  # sp reads no roles


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["param=mup", "param.base_d_model=null"], "param.base_d_model"),
        (["param=mup", "param.base_n_layer=2"], "param.base_n_layer"),
        (["param=completep", "param.base_n_layer=null"], "param.base_n_layer"),
        (["param=sp", "param.base_d_model=64"], "param.base_d_model"),
        (["param=mup", "param.base_d_model=0"], "param.base_d_model"),
        (["param=completep", "optim=sgd"], "optim.kind"),
        (["param.kind=mupp"], "param.kind"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as caught:
        validate_train(compose("train", overrides))
    assert caught.value.field == field


def test_the_coordinate_check_is_flat_under_mup_and_grows_under_sp():
    """Yang et al. 2022 Fig. 5: after a few Adam steps, sp's block outputs grow about linearly with width,
    μP's stay put; measured slopes 0.98 and -0.1 to -0.2 at these sizes."""
    cfg = _model("model.n_layer=2", "model.attention.n_head=4")
    widths = [32, 64, 128, 256]
    sp = coordinate_check(cfg, _param("sp"), widths, steps=2, batch_size=4, seq_len=16)["slopes"]
    mup = coordinate_check(cfg, _param("mup", 32), widths, steps=2, batch_size=4, seq_len=16)["slopes"]
    for name in ("block 0", "block 1"):
        assert sp[name] > 0.7 and abs(mup[name]) < 0.3, (name, sp[name], mup[name])
    assert sp["logits"] > 0.4 and abs(mup["logits"]) < 0.3


def test_the_depth_check_is_flat_under_completep_and_grows_under_mup():
    cfg = _model("model.d_model=32", "model.attention.n_head=2")
    depths = [2, 4, 8]
    mup = coordinate_check(cfg, _param("mup", 32), depths, "n_layer", steps=2, batch_size=4, seq_len=16)
    completep = coordinate_check(cfg, _param("completep", 32, 2), depths, "n_layer", steps=2, batch_size=4, seq_len=16)
    assert mup["slopes"]["last block"] > 0.5 and abs(completep["slopes"]["last block"]) < 0.2


def test_the_optimizer_state_round_trips_through_its_state_dict():
    """A resume rebuilds the groups and loads the state: both runs then take identical steps."""
    param = _param("completep", 16, 1)
    cfg = parametrize(_model("model.d_model=32", "model.n_layer=2", "model.attention.n_head=2"), param)
    idx = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))

    def step(model, optimizer):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        optimizer.step()

    torch.manual_seed(0)
    model = build_model(cfg)
    initialise(model, param)
    optimizer = build_optimizer(model, OPTIM, CPU, param=param)
    step(model, optimizer)
    saved = ({k: v.clone() for k, v in model.state_dict().items()}, copy.deepcopy(optimizer.state_dict()))
    step(model, optimizer)
    resumed = Decoder(cfg)
    resumed.load_state_dict(saved[0])
    again = build_optimizer(resumed, OPTIM, CPU, param=param)
    again.load_state_dict(saved[1])
    step(resumed, again)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


STEPS = ["trainer.max_steps=6", "trainer.val_check_interval=3", "model.n_layer=2", "model.d_model=64"]
COMPLETEP = ["param=completep", "param.base_d_model=32", "param.base_n_layer=1"]


@pytest.mark.slow  # two processes twice and one single run (about 60 s): -m slow
def test_completep_under_ddp_and_fsdp2_matches_one_process_and_resumes(conf, tmp_path):
    from archlab.training.run import train

    single = tmp_path / "single"
    train(compose_train(conf, single, [*STEPS, *COMPLETEP, "data.batch_size=8"]))
    reference = load_weights(single / "model.safetensors").state_dict()
    summary = json.loads((single / "summary.json").read_text())
    assert summary["model"]["head"]["logit_scale"] == 0.5 and summary["model"]["block"]["residual_multiplier"] == 0.5
    for strategy in ("ddp_cpu", "fsdp"):
        out = tmp_path / strategy
        common = [*STEPS, *COMPLETEP, f"trainer={strategy}", "data.batch_size=4", "callbacks.checkpoint.save_top_k=-1"]
        proc = cli(conf, out, common)
        assert proc.returncode == 0, proc.stderr[-3000:]
        weights = load_weights(out / "model.safetensors").state_dict()
        assert max((weights[k] - reference[k]).abs().max().item() for k in reference) < 1e-5
        proc = cli(
            conf, tmp_path / f"{strategy}_resumed", [*common, f"ckpt_path={out / 'checkpoints' / 'step000003.ckpt'}"]
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        again = load_weights(tmp_path / f"{strategy}_resumed" / "model.safetensors").state_dict()
        assert all(torch.equal(again[k], weights[k]) for k in weights), strategy


def _proxy(root, param: dict, losses: dict[str, list[float]]):
    """A hand-built proxy sweep: per learning rate, one run per seed with that final val/loss."""
    for lr, per_seed in losses.items():
        for seed, loss in enumerate(per_seed):
            job(root, [f"optim.lr={lr}", f"seed={seed}"], [loss + 1, loss], config={"param": param})


def test_lr_from_takes_the_proxys_best_mean_rate_and_warns_at_the_grid_edge(tmp_path):
    mup = _param("mup", 64)
    _proxy(tmp_path / "mid", mup, {"1e-3": [2.0, 2.2], "3e-3": [1.9, 2.0], "1e-2": [2.1, 1.8]})
    found = transferred(tmp_path / "mid", "optim.lr", "val/loss", "lr_from")
    assert (found.value, found.mean, found.seeds, found.edges) == ("3e-3", pytest.approx(1.95), 2, [])
    assert found.param == mup
    _proxy(tmp_path / "edge", mup, {"1e-3": [2.0, 2.2], "3e-3": [1.9, 2.0], "1e-2": [1.7, 1.8]})
    edge = transferred(tmp_path / "edge", "optim.lr", "val/loss", "lr_from")
    assert edge.value == "1e-2" and len(edge.edges) == 1 and "highest" in edge.text


def test_lr_from_sets_the_rate_and_refuses_another_parametrisation_or_group(tmp_path):
    _proxy(tmp_path / "proxy", _param("mup", 64), {"1e-3": [2.0], "3e-3": [1.9]})
    lr_from = f"lr_from={tmp_path / 'proxy'}"
    cfg = compose("train", ["param=mup", "model.d_model=256", f"lr_from={tmp_path / 'proxy'}"])
    transfer_lr(cfg)
    assert cfg.optim.lr == 3e-3
    with pytest.raises(ConfigError, match="parametrisation") as caught:
        transfer_lr(compose("train", ["param=sp", f"lr_from={tmp_path / 'proxy'}"]))
    assert caught.value.field == "lr_from"
    job(tmp_path / "proxy", ["optim.lr=1e-3", "seed=0", "model.d_model=32"], [2.0], config={"param": _param("mup", 64)})
    with pytest.raises(ConfigError, match="none has model.d_model=256") as caught:  # a group of no run
        transfer_lr(compose("train", ["param=mup", "model.d_model=256", lr_from], return_hydra_config=True))
    assert caught.value.field == "lr_from"
    with pytest.raises(ConfigError) as caught:  # both would set the rate
        validate_train(compose("train", ["optim.lr=1e-3", f"lr_from={tmp_path / 'proxy'}"]))
    assert caught.value.field == "lr_from"


def _multi_axis_proxy(root):
    """A hand-built ``-m`` sweep of optim.lr × model/mlp × seed under mup at width 64: gelu's best rate is
    1e-2, swiglu's 1e-3 (final losses, two seeds each)."""
    losses = {"gelu": {"1e-3": [2.0, 2.2], "1e-2": [1.7, 1.9]}, "swiglu": {"1e-3": [1.5, 1.6], "1e-2": [1.8, 2.0]}}
    for mlp, by_lr in losses.items():
        for lr, per_seed in by_lr.items():
            for seed, loss in enumerate(per_seed):
                overrides = ["param=mup", f"optim.lr={lr}", f"model/mlp={mlp}", f"seed={seed}"]
                job(root, overrides, [loss + 1, loss], config={"param": _param("mup", 64)})


def _train_cfg(*overrides: str):
    return compose("train", ["param=mup", "param.base_d_model=64", *overrides], return_hydra_config=True)


def test_lr_from_takes_the_group_of_a_multi_axis_sweep_the_run_shares_or_names(tmp_path):
    """A sweep of optim.lr and model/mlp: a run at another width hands on the rate of the group its command
    line shares (model/mlp=swiglu: 1e-3, the lower mean 1.55), or of the group lr_from_group names (gelu:
    1e-2, mean 1.8; a number as a number); a run in neither, a group key the sweep does not vary, or
    lr_from_group without lr_from is refused naming the field."""
    _multi_axis_proxy(tmp_path / "proxy")
    lr_from = f"lr_from={tmp_path / 'proxy'}"
    shared = _train_cfg("model.d_model=256", "model/mlp=swiglu", lr_from)
    transfer_lr(shared)
    assert shared.optim.lr == 1e-3
    found = transferred(tmp_path / "proxy", "optim.lr", "val/loss", "lr_from", {"model/mlp": "gelu"})
    assert (found.value, found.mean, found.seeds, found.group) == ("1e-2", pytest.approx(1.8), 2, {"model/mlp": "gelu"})
    assert "of the group model/mlp=gelu" in found.text
    named = _train_cfg("model.d_model=256", lr_from, "lr_from_group={model/mlp: gelu}")
    transfer_lr(named)
    assert named.optim.lr == 1e-2
    with pytest.raises(ConfigError, match=r"none has model/mlp=\(default\).*model/mlp=gelu; model/mlp=swiglu") as err:
        transfer_lr(_train_cfg("model.d_model=256", lr_from))  # this run's MLP is the default: no group's
    assert err.value.field == "lr_from"
    with pytest.raises(ConfigError, match="axes of the sweep but optim.lr: model/mlp") as err:
        transfer_lr(_train_cfg(lr_from, "lr_from_group={model.d_model: 64}"))
    assert err.value.field == "lr_from_group"
    with pytest.raises(ConfigError) as err:
        validate_train(_train_cfg("lr_from_group={model/mlp: gelu}"))
    assert err.value.field == "lr_from_group"


def test_a_proxy_width_the_heads_do_not_divide_is_refused_naming_it():
    """base_d_model=34 over 4 heads: a proxy head dim of 8.5, which flooring to 8 would misscale every
    attention score; refused naming the field, and taken with the proxy's head dim given outright."""
    cfg = _model()
    assert cfg.attention.n_head == 4 and cfg.attention.head_dim is None
    with pytest.raises(ConfigError) as err:
        check_param(_param("mup", 34), cfg, "adamw")
    assert err.value.field == "param.base_d_model" and "multiple of model.attention.n_head=4" in str(err.value)
    check_param(_param("mup", 34, base_head_dim=8), cfg, "adamw")
    check_param(_param("completep", 36, 2), cfg, "adamw")


@pytest.mark.parametrize(
    "setting, why",
    [
        (
            "widths=[64,64]",
            "two or more distinct positive integers",
        ),  # the slope's regression had one x: after training
        (
            "widths=[64,66]",
            "d_model=66 is a valid model: model.attention.n_head=4 is invalid",
        ),  # 4 heads do not split 66
        ("depths=[2,2]", "two or more distinct positive integers"),
    ],
)
def test_archlab_coord_refuses_sizes_it_cannot_fit_before_training(setting, why):
    from archlab.build import compose
    from archlab.training.coordcheck import check_settings

    field = setting.partition("=")[0]
    cfg = compose("coord", [setting, *(["widths=null"] if field == "depths" else [])])
    with pytest.raises(ConfigError) as err:
        check_settings(cfg)
    assert err.value.field == field and why in str(err.value)


def test_mup_gives_the_parallel_mixers_attention_part_its_temperature():
    """The parallel mixer (Falcon-H1's attention beside Mamba-2) holds its softmax scores' multiplier in its
    attention part: at twice the proxy's width (d_model 128 over 64, 4 heads of 32 against 16) μP's
    temperature (1/sqrt(32))·sqrt(16/32) = 1/8 reaches it, as the model's mixer and as a layer kind's
    (it was left at sp's 1/sqrt(32)); the model's causal layers get theirs."""
    parallel = ["model.attention.kind=parallel", "+model.attention.ssm={n_head: 4}"]
    param = _param("mup", 64)
    scaled = parametrize(_model(*parallel), param)
    assert cast(Any, build_model(scaled, device="meta").blocks[0]).attn.attention.scale == pytest.approx(1 / 8)
    kind = ["+model.layers.kinds.both={attention: {kind: parallel, ssm: {n_head: 4}}}"]
    model = build_model(
        parametrize(_model(*kind, "+model.layers.kinds.plain={}", "model.layers.pattern=[both,plain]"), param),
        device="meta",
    )
    first, second = [cast(Any, block).attn for block in model.blocks][:2]
    assert [first.attention.scale, second.scale] == [pytest.approx(1 / 8)] * 2


def test_a_layer_kinds_heads_that_do_not_split_the_proxy_width_are_refused_naming_it():
    """A kind of 8 heads over a proxy of width 36: a proxy head dim of 4.5, refused naming the kind's field,
    though the model's own 4 heads split 36 (it was floored to 4, misscaling that kind's scores)."""
    cfg = _model(
        "+model.layers.kinds.many={attention: {n_head: 8}}",
        "+model.layers.kinds.plain={}",
        "model.layers.pattern=[many,plain]",
    )
    with pytest.raises(ConfigError) as err:
        check_param(_param("mup", 36), cfg, "adamw")
    assert err.value.field == "param.base_d_model"
    assert "multiple of model.layers.kinds.many.attention.n_head=8" in str(err.value)
    check_param(_param("mup", 40), cfg, "adamw")
    check_param(_param("mup", 36, base_head_dim=8), cfg, "adamw")


def test_mup_holds_a_sqrt_d_model_embedding_multiplier_at_the_proxys_width():
    """Gemma's embeddings × sqrt(d_model) would grow the input layer's coordinates as sqrt(m) (the
    coordinate check's embeddings slope was 0.52): away from the proxy μP multiplies by sqrt(base_d_model),
    as an embedding multiplier; at the proxy's own width the model is sp's, Gemma's rounding and all."""
    cfg = _model("model.scale_embedding=true", "model.d_model=128")
    scaled = parametrize(cfg, _param("completep", 32, 4))
    assert (scaled.scale_embedding, scaled.embedding_multiplier) == (False, math.sqrt(32))
    assert parametrize(cfg, _param("mup", 128)) == cfg
    torch.manual_seed(0)
    model = build_model(scaled)
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.setdefault("x", args[0]))
    idx = torch.tensor([[1, 2, 3]])
    model(idx)
    expected = model.tok_emb(idx) * math.sqrt(32) + cast(Any, model.position).table(torch.arange(3))
    torch.testing.assert_close(seen["x"], expected)
