"""nGPT (archlab/nn/ngpt.py, its attention, MLP and head, ``model.norm.kind=l2``) against the model written out
here from the paper's equations (Loshchilov et al. 2024, arXiv:2410.01131, §2): its logits, its counts by hand,
its refusals and a short fit."""

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.parts import build, check_trains, plain, tokens

from archlab import ConfigError, build_model, count_params
from archlab.nn.validation import ignored, validate
from archlab.training.parametrization import check_param

pytestmark = pytest.mark.usefixtures("single_thread")

D, H, V, FF = 32, 4, 48, 40
NGPT = {
    "norm": {"kind": "l2", "eps": 1e-12},
    "block": {"kind": "ngpt"},
    "attention": {"kind": "ngpt"},
    "mlp": {"kind": "ngpt", "d_ff": FF},
    "head": {"kind": "ngpt", "tied": False},
}


def ngpt(**overrides):
    return plain(**{**NGPT, **overrides})


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def paper_logits(model, idx):
    """§2.1-2.5 written out: h on the sphere; per block h_A = norm(ATTN(h)), h ← norm(h + α_A(h_A − h)), then the
    MLP's likewise; ATTN with q = norm(W_q h)·s_qk and k = norm(W_k h)·s_qk per head and softmax(q·k·√d_k);
    MLP W_o(u ⊙ SiLU(v)) with u = W_u h·s_u, v = W_v h·s_v·√d; logits z = E h·s_z. Every s and α is the
    stored value times init/scale (§2.6): α 0.05 / (1/√d), s_qk 1 / (1/√d), s_u and s_v 1 / 1, s_z 1 / (1/√d)."""
    hd, T = D // H, idx.shape[1]
    h = unit(model.tok_emb.weight[idx])
    for block in model.blocks:
        a, m = block.attn, block.mlp
        q, k, v = (h @ a.qkv.weight.T).split(D, dim=-1)
        s_qk = (a.qk_scale.weight * (1.0 / (1 / math.sqrt(D)))).view(H, 1, hd)
        q, k, v = (t.view(*idx.shape, H, hd).transpose(1, 2) for t in (q, k, v))
        q, k = unit(q) * s_qk, unit(k) * s_qk
        scores = (q @ k.transpose(-2, -1) * math.sqrt(hd)).masked_fill(~torch.ones(T, T).tril().bool(), -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(*idx.shape, D) @ a.proj.weight.T
        alpha_a = block.attn_alpha.weight * (0.05 / (1 / math.sqrt(D)))
        h = unit(h + alpha_a * (unit(y) - h))
        gate, up = (h @ m.gate_up.weight.T).chunk(2, dim=-1)
        u, vv = up * m.up_scale.weight, gate * m.gate_scale.weight * math.sqrt(D)
        alpha_m = block.mlp_alpha.weight * (0.05 / (1 / math.sqrt(D)))
        h = unit(h + alpha_m * (unit((u * F.silu(vv)) @ m.down.weight.T) - h))
    return (h @ model.head.weight.T) * (model.head.s_z.weight * (1.0 / (1 / math.sqrt(D))))


def test_the_model_is_the_papers():
    """Every weight random (step sizes, s_qk, s_u, s_v and s_z far from their init, all positive as the paper's):
    the logits equal the paper's model at float64 rounding."""
    cfg = ngpt()
    model = build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.abs_()  # the paper's step sizes are positive; archlab takes |α| as Dory does
        idx = tokens(cfg, T=9)
        torch.testing.assert_close(model(idx), paper_logits(model, idx))


def test_a_step_size_counts_by_its_magnitude():
    """A negative stored α moves the state as its magnitude does (|α|, the reference code's and Dory's)."""
    cfg = ngpt()
    model = build(cfg)
    idx = tokens(cfg, T=6)
    with torch.no_grad():
        before = model(idx)
        block: Any = model.blocks[0]
        block.attn_alpha.weight.neg_()
        torch.testing.assert_close(model(idx), before)


def test_the_scaled_parameters_start_at_their_init():
    """Built and initialised, each stored value is its scale, so the value used is its init: α 0.05, s_qk √hd
    (beside the scores' 1/√hd: the paper's s_qk of 1 and its √hd), s_u 1, s_v √d, s_z 1."""
    model: Any = build_model(ngpt())
    block = model.blocks[0]
    torch.testing.assert_close(block.attn_alpha.weight, torch.full((D,), 1 / math.sqrt(D)))
    torch.testing.assert_close(block.attn_alpha(), torch.full((D,), 0.05))
    torch.testing.assert_close(block.attn.qk_scale(), torch.full((D,), math.sqrt(D // H)))
    torch.testing.assert_close(block.mlp.up_scale(), torch.ones(FF))
    torch.testing.assert_close(block.mlp.gate_scale(), torch.full((FF,), math.sqrt(D)))
    torch.testing.assert_close(model.head.s_z(), torch.ones(V))


def test_counts_by_hand():
    """Per layer: q, k, v, o (4·d², no biases) and s_qk (d); W_u, W_v, W_o (3·d·ff) and s_u, s_v (2·ff); α_A
    and α_M (2·d); the l2 norms hold nothing; the head d·V and s_z (V)."""
    c = count_params(ngpt())
    assert c["attention"] == 2 * (4 * D * D + D)
    assert c["mlp"] == 2 * (3 * D * FF + 2 * FF)
    assert c["norms"] == 2 * 2 * D  # the block's own parameters: its step sizes
    assert c["final_norm"] == 0
    assert c["head"] == D * V + V
    assert c["total"] == V * D + c["attention"] + c["mlp"] + c["norms"] + c["head"]


def test_it_reads_its_fields():
    assert ignored(ngpt(block={"kind": "ngpt", "alpha_init": 0.1, "alpha_scale": 0.2})) == []
    names = {i.field for i in ignored(plain(block={"kind": "pre", "alpha_init": 0.1}))}
    assert names == {"model.block.alpha_init"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"norm": {"kind": "rmsnorm"}}, "model.norm.kind"),
        ({"block": {"kind": "ngpt", "alpha_init": 0.0}}, "model.block.alpha_init"),
        ({"attention": {"kind": "ngpt", "qk_norm": "head"}}, "model.attention.qk_norm"),
        ({"attention": {"kind": "ngpt", "gate_scale_init": 1.0}}, "model.attention.gate_scale_init"),
        ({"attention": {"kind": "ngpt", "v_norm": True}}, "model.attention.v_norm"),
        ({"attention": {"kind": "ngpt", "v_from_k": True}}, "model.attention.v_from_k"),
        ({"head": {"kind": "ngpt", "softcap": 30.0}}, "model.head.softcap"),
        ({"stream": {"kind": "hyper"}}, "model.stream.kind"),
    ],
    ids=["rmsnorm", "alpha", "qk-norm", "gate-scale", "v-norm", "v-from-k", "softcap", "streams"],
)
def test_refusals(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(ngpt(**overrides))
    assert error.value.field == field


def test_mup_is_refused_naming_why():
    """μP's width rules cannot apply to the scaled parameters: param=mup is refused, naming the block."""
    param = {"kind": "mup", "base_d_model": 16, "base_n_layer": None, "base_head_dim": None}
    with pytest.raises(ConfigError, match="NGPT .*scaled-parameter form"):
        check_param(param, ngpt(), "adamw")


def test_it_trains():
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    parts = ["model/norm=l2", "model/block=ngpt", "model/attention=ngpt", "model/mlp=ngpt", "model/head=ngpt"]
    check_trains([*parts, "model/position=rope"], n_layer=2, length=32, steps=25)


def unit_norms(model: Any) -> list[torch.Tensor]:
    """The norms along d_model of every matrix nGPT keeps on the sphere: q/k/v, gate and MLP rows, the output
    projections' columns, the head's and the embedding's rows."""
    out = [model.tok_emb.weight.norm(dim=1), model.head.weight.norm(dim=1)]
    for block in model.blocks:
        out += [block.attn.qkv.weight.norm(dim=1), block.attn.proj.weight.norm(dim=0)]
        out += [block.mlp.gate_up.weight.norm(dim=1), block.mlp.down.weight.norm(dim=0)]
    return out


@pytest.mark.parametrize("unit", [True, False])
def test_a_step_puts_the_matrices_back_on_the_sphere(unit):
    """Two AdamW steps through Lightning (LitModel's optimizer_step): with ``unit_weights`` every matrix is unit
    along d_model after them (§2.1-2.4); without it the steps leave them off the sphere."""
    import lightning as L

    from archlab.config import model_config_dict
    from archlab.training.module import LitModel

    cfg = ngpt(block={"kind": "ngpt", "unit_weights": unit})
    optim = {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.0, "betas": [0.9, 0.99], "eps": 1e-8}
    scheduler = {"kind": "constant", "warmup_steps": 0, "min_lr_ratio": 1.0, "decay_steps": None}
    lit = LitModel(model_config_dict(cfg), optim, scheduler)
    idx = tokens(cfg, T=8, B=4)
    batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(idx, idx.roll(-1, 1)), batch_size=4)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    trainer.fit(lit, batches)
    norms = torch.cat(unit_norms(lit.model))
    on_sphere = torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    assert on_sphere is unit
