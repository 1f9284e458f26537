"""mhc's start-up values (``model.stream.init``): a fresh model's connections and merge against the values
transformers' ``_init_weights`` gives HY V4's ``HYV4HyperConnection`` / ``HYV4HyperHead`` (``hy_v4``) and
DeepSeek-V4's ``DeepseekV4HyperConnection`` / ``DeepseekV4HyperHead`` (``deepseek_v4``, the default) of the
same n and mix, exactly; the other pairs by HY V4's rule written out; the matrices' std; the values kept
under μP and CompleteP; and what they do: with HY V4's, a fresh model's first connection reads the streams'
mean."""

from __future__ import annotations

import math

import pytest
import torch

from archlab import ConfigError, build_model, compose_model
from archlab.config import ModelConfig
from archlab.interop.hf import config_from_hf
from archlab.nn.streams.mhc import MHCConnection
from archlab.training.parametrization import initialise

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")

D = 32
TINY = ["model=nano", f"model.d_model={D}", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
MHC_MODEL = [*TINY, "model/stream=mhc", "model/norm=rmsnorm", "model.norm.eps=1e-6"]


def _cfg(n: int, mix: str, init: str, *more: str) -> ModelConfig:
    return compose_model(
        [*MHC_MODEL, f"model.stream.n={n}", f"model.stream.mix={mix}", f"model.stream.init={init}", *more]
    )


def _theirs(n: int, init: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """transformers' connection and head of ``n`` streams, as its ``_init_weights`` starts them: HY V4's
    (no mix) or DeepSeek-V4's (Sinkhorn's mix)."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as dsv4
    from transformers.models.hy_v4 import modeling_hy_v4 as hyv4

    if init == "hy_v4":
        c = transformers.HYV4Config(hidden_size=D, hc_mult=n, num_attention_heads=4)
        owner, parts = hyv4.HYV4PreTrainedModel(c), (hyv4.HYV4HyperConnection(c), hyv4.HYV4HyperHead(c))
    else:
        c = transformers.DeepseekV4Config(hidden_size=D, hc_mult=n, num_attention_heads=4)
        parts = (dsv4.DeepseekV4HyperConnection(c), dsv4.DeepseekV4HyperHead(c))
        owner = dsv4.DeepseekV4PreTrainedModel(c)
    for part in parts:
        owner._init_weights(part)
    return parts


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("init, mix", [("hy_v4", "none"), ("deepseek_v4", "sinkhorn")])
def test_the_start_up_values_are_transformers(init, mix, n):
    """Every connection's base and scale and the merge's hc_base and hc_scale equal transformers' bit for bit
    (HY V4's pre bias -log(max(n - 1, 1)): 0 at n 1 and 2, -log 2 at 3 ...)."""
    model = build_model(_cfg(n, mix, init))
    connection, head = _theirs(n, init)
    for block in model.blocks:
        for ours in (block.attn_stream, block.mlp_stream):
            assert ours.base.shape == connection.base.shape and torch.equal(ours.base, connection.base)
            assert torch.equal(ours.scale, connection.scale)
    assert torch.equal(model.stream.hc_base, head.hc_base) and torch.equal(model.stream.hc_scale, head.hc_scale)


@pytest.mark.parametrize("n", [2, 4])
def test_the_other_pairs_follow_each_rule(n):
    """No class holds HY V4's values with Sinkhorn's mix or DeepSeek-V4's without: HY V4's rule (pre's n
    biases -log(n - 1), the post and comb ones 0, every scale 0.01) and DeepSeek-V4's (0, 1), by hand."""
    hy = build_model(_cfg(n, "sinkhorn", "hy_v4"))
    pre = torch.full((n,), -math.log(n - 1), dtype=torch.float32)
    expected = torch.cat([pre, torch.zeros(n + n * n)])
    assert torch.equal(hy.blocks[0].attn_stream.base, expected)
    assert torch.equal(hy.blocks[1].mlp_stream.scale, torch.full((3,), 0.01))
    assert torch.equal(hy.stream.hc_base, pre) and torch.equal(hy.stream.hc_scale, torch.full((1,), 0.01))
    ds = build_model(_cfg(n, "none", "deepseek_v4"))
    assert torch.equal(ds.blocks[0].mlp_stream.base, torch.zeros(2 * n))
    assert torch.equal(ds.blocks[1].attn_stream.scale, torch.ones(2))
    assert torch.equal(ds.stream.hc_base, torch.zeros(n)) and torch.equal(ds.stream.hc_scale, torch.ones(1))


@pytest.mark.parametrize("init", ["hy_v4", "deepseek_v4"])
def test_the_matrices_are_drawn_at_init_std(init):
    """fn and hc_fn N(0, model.init_std) whichever values start the rest (transformers' initializer_range):
    d 256, n 4 gives fn 8 × 1,024 entries a connection and hc_fn 4 × 1,024, std within 3% (σ's own
    spread over 4,096 draws is 1.1%)."""
    cfg = compose_model(
        [*MHC_MODEL, "model.d_model=256", "model.stream.mix=none", f"model.stream.init={init}", "model.init_std=0.05"]
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    for fn in (model.blocks[0].attn_stream.fn, model.blocks[1].mlp_stream.fn, model.stream.hc_fn):
        assert abs(fn.std().item() / 0.05 - 1) < 0.03 and abs(fn.mean().item()) < 0.05 * 0.05


@pytest.mark.parametrize(
    "param",
    [
        {"kind": "mup", "base_d_model": 16, "base_n_layer": 2},
        {"kind": "completep", "base_d_model": 16, "base_n_layer": 1},
    ],
)
def test_mup_and_completep_keep_the_start_up_values(param):
    """μP rescales the matrices (fn is an output matrix: std × 1/m) and CompleteP at another depth draws the
    model afresh first: the biases and scales, vectors, stay HY V4's."""
    model = build_model(_cfg(3, "none", "hy_v4"))
    fn = model.blocks[0].attn_stream.fn.clone()
    initialise(model, param)
    connection, head = _theirs(3, "hy_v4")
    for block in model.blocks:
        for ours in (block.attn_stream, block.mlp_stream):
            assert torch.equal(ours.base, connection.base) and torch.equal(ours.scale, connection.scale)
    assert torch.equal(model.stream.hc_base, head.hc_base) and torch.equal(model.stream.hc_scale, head.hc_scale)
    if param["kind"] == "mup":  # m = 32 / 16
        assert torch.equal(model.blocks[0].attn_stream.fn, fn / 2)


def _first_read(init: str, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh model's streams at its first connection and what that connection hands attention's norm."""
    torch.manual_seed(0)  # the draws of fn: the bound below holds for these
    model = build_model(_cfg(n, "none", init)).eval()
    seen: dict[str, torch.Tensor] = {}
    block = model.blocks[0]

    def keep(name: str):
        def hook(module: torch.nn.Module, args: tuple) -> None:
            seen.setdefault(name, args[0])

        return hook

    block.attn_stream.register_forward_pre_hook(keep("streams"))
    block.attn_norm.register_forward_pre_hook(keep("read"))
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1)))
    return seen["streams"], seen["read"]


def test_hy_v4s_values_start_every_read_at_the_streams_mean():
    """pre = σ(0.01·x·W_pre - log(n - 1)) + ε: 1/n each but for 0.01·xW (|xW| ~ 0.02·sqrt(n·d) = 0.23 here,
    σ's slope 3/16), so the first connection hands attention the streams' mean (the embeddings, copied into
    each) within 0.5% (Σpre's spread); DeepSeek-V4's σ(xW) + ε ≈ 1/2 each hands it about n/2 = 2 times them."""
    streams, read = _first_read("hy_v4")
    torch.testing.assert_close(read, streams.mean(2), rtol=5e-3, atol=1e-7)
    ds_streams, ds_read = _first_read("deepseek_v4")
    ratio = (ds_read.norm() / ds_streams.mean(2).norm()).item()
    assert 1.5 < ratio < 2.5


def test_the_weights_of_distinct_streams_are_one_over_n():
    """Distinct streams through a connection at HY V4's values: pre 1/n each (within 2e-3: σ's slope 3/16
    there times 0.01·xW, |xW| < 0.7 in 3 sd), so the sublayer reads their mean; post hc_magnitude·σ(0.01·xW)
    ≈ half of hc_magnitude (within 5e-3: slope 1.5/4)."""
    n = 4
    connection = MHCConnection(_cfg(n, "none", "hy_v4", "model.stream.post_scale=1.5", "model.stream.post_eps=true"))
    torch.manual_seed(3)
    connection.init_parameters(0.02, 0.0)
    h = torch.randn(2, 5, n, D, generator=torch.Generator().manual_seed(2))
    pre, post, comb = connection.weights(h)
    assert comb is None
    torch.testing.assert_close(pre, torch.full_like(pre, 1 / n), rtol=0, atol=2e-3)
    torch.testing.assert_close(post, torch.full_like(post, 0.75), rtol=0, atol=5e-3)
    read: dict[str, torch.Tensor] = {}
    connection(h, lambda x: read.setdefault("x", x))
    torch.testing.assert_close(read["x"], h.mean(2), rtol=0, atol=2e-3 * h.abs().max().item())


def test_the_hy_v4_record_reads_its_start_up_values():
    """A HYV4Config read gives ``init: hy_v4`` (a model trained from scratch starts as transformers' does);
    DeepSeek-V4's keeps the default."""
    hy = config_from_hf(transformers.HYV4Config(hidden_size=D, hc_mult=4, num_attention_heads=4))
    assert (hy.stream.kind, hy.stream.init) == ("mhc", "hy_v4")
    assert config_from_hf(transformers.DeepseekV4Config()).stream.init == "deepseek_v4"
    assert compose_model(MHC_MODEL).stream.init == "deepseek_v4"


def test_another_value_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as err:
        _cfg(4, "none", "olmo")
    assert err.value.field == "model.stream.init" and "deepseek_v4" in str(err.value)
