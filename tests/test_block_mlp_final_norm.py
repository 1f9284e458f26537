"""``model.block.mlp_norm: false`` and ``final_norm: false`` (archlab/nn/block.py's pre wiring, Qwen4-Exp's
layers and head): the MLP, and the head, read the stream unnormed and no norm is built. A block against its
own sublayers written out, the model's logits against its head on the last block's output, the counts, the
refusals."""

import pytest
import torch
from helpers.hf import check_routed_family_refuses, layout
from helpers.mixers import randomise

from archlab import ConfigError, build_model, compose_model, count_params

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]


def test_the_mlp_reads_the_stream_unnormed():
    """x + attn(norm(x)) = h, then h + mlp(h): the block's own sublayers, every weight random."""
    model = randomise(build_model(compose_model([*TINY, "model.block.mlp_norm=false"])), seed=1).eval()
    block = model.blocks[0]
    assert block.mlp_norm is None and block.attn_norm is not None
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        h = x + block.attn(block.attn_norm(x), None, None, None, 0)
        torch.testing.assert_close(block(x), h + block.mlp(h), rtol=1e-6, atol=1e-6)


def test_the_head_reads_the_last_block_unnormed():
    """No final norm: the logits are the tied head on the last block's output; on gated streams, on their
    merge (Qwen4-Exp's layout: no norm before the MLP, none before the head)."""
    for extra in (
        [],
        ["model/stream=gated", "model.stream.rank=8", "model/norm=rmsnorm", "model.block.mlp_norm=false"],
    ):
        model = randomise(build_model(compose_model([*TINY, "model.block.final_norm=false", *extra])), seed=2).eval()
        assert model.final_norm is None
        idx = torch.randint(0, 64, (2, 6))
        seen: list[torch.Tensor] = []
        model.blocks[-1].register_forward_hook(lambda m, args, out, seen=seen: seen.append(out))
        with torch.no_grad():
            logits = model(idx)
            last = seen[-1] if model.stream is None else model.stream.merge(seen[-1])
            torch.testing.assert_close(logits, model.head(last), rtol=1e-6, atol=1e-6)


def test_the_counts_leave_out_the_norms():
    """A LayerNorm of 32 is 64 parameters: one fewer per layer without the MLP's, and no final one."""
    plain = count_params(compose_model(TINY))
    bare = count_params(compose_model([*TINY, "model.block.mlp_norm=false", "model.block.final_norm=false"]))
    assert plain["norms"] - bare["norms"] == 2 * 64 and (plain["final_norm"], bare["final_norm"]) == (64, 0)
    assert plain["total"] - bare["total"] == 3 * 64


@pytest.mark.parametrize("field", ["mlp_norm", "final_norm"])
@pytest.mark.parametrize("kind", ["post", "sandwich", "parallel"])
def test_other_wirings_refuse_them(kind, field):
    with pytest.raises(ConfigError) as error:
        compose_model([*TINY, f"model/block={kind}", f"model.block.{field}=false"])
    assert error.value.field == f"model.block.{field}"


def test_a_norm_gate_needs_its_norm():
    with pytest.raises(ConfigError) as error:
        compose_model([*TINY, "model.block.mlp_norm=false", "model.block.mlp_norm_gate=4"])
    assert error.value.field == "model.block.mlp_norm_gate"


@pytest.mark.parametrize("field", ["mlp_norm", "final_norm"])
def test_families_refuse_them(field):
    check_routed_family_refuses("gpt_neox", layout(f"model.block.{field}=false"), f"model.block.{field}")
