"""Looped layers (``model.layers.loop``): a looped model computes what the unrolled model does, each looped layer
written out once per pass with the shared weights copied in (a hand-built reference), with and without padding,
in training and through the KV cache (its pieces, greedy and padded generation); its counts by hand (weights
once, FLOPs and cache per pass); gradients of a shared weight the sum of its copies'; μP's groups unchanged;
each bad value one ConfigError naming the field; archlab-check's layout line and the export's refusal."""

from __future__ import annotations

import dataclasses
import functools
from typing import cast

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces, hybrid_config, mixer_config, randomise

from archlab import build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.cli.check import _layout
from archlab.config import LayersConfig, ModelConfig
from archlab.config.layers import layer_kind
from archlab.config.model import LoopConfig
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.interop.families import FAMILIES
from archlab.interop.hf import exportability
from archlab.nn.model import Decoder
from archlab.nn.validation import ignored, validate, without_ignored
from archlab.training.optim import build_optimizer

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def with_loop(cfg: ModelConfig, start: int, end: int | None, passes: int) -> ModelConfig:
    return dataclasses.replace(cfg, layers=dataclasses.replace(cfg.layers, loop=LoopConfig(start, end, passes)))


def unrolled(cfg: ModelConfig, order: list[int]) -> ModelConfig:
    """The model without a loop that runs ``order``'s layers one after another, each of its own kind."""
    first = [cast(str, layer_kind(cfg, i)) for i in order] if cfg.layers.kinds else []
    return dataclasses.replace(cfg, n_layer=len(order), layers=LayersConfig(kinds=cfg.layers.kinds, first=first))


def copied(model: Decoder, reference: Decoder, order: list[int]) -> Decoder:
    """``reference`` with block j holding a copy of ``model``'s block ``order[j]``, the rest ``model``'s."""
    state = {n: t for n, t in model.state_dict().items() if not n.startswith("blocks.")}
    for j, i in enumerate(order):
        prefix = f"blocks.{i}."
        state |= {f"blocks.{j}.{n[len(prefix) :]}": t for n, t in model.state_dict().items() if n.startswith(prefix)}
    reference.load_state_dict(state)
    return reference.eval()


# name -> (model, loop start, end, passes, the layers the unrolled model runs)
CASES = {
    # the last two of 3 causal layers three times: 0, 1, 2, 1, 2, 1, 2
    "causal": (mixer_config("causal", n_layer=3), 1, None, 3, [0, 1, 2, 1, 2, 1, 2]),
    # Gated DeltaNet, causal, Gated DeltaNet: the first two twice (a recurrent state and a KV cache per pass)
    "gated_deltanet": (hybrid_config("gated_deltanet"), 0, 2, 2, [0, 1, 0, 1, 2]),
    # Mamba-2 (convolution and state per pass), causal, Mamba-2: the middle one three times
    "mamba2": (hybrid_config("mamba2"), 1, 2, 3, [0, 1, 1, 1, 2]),
    # hyper-connections over 3 streams, dynamic: each pass of a layer reads and writes them through its connections
    "hyper": (mixer_config("causal", n_layer=2, stream={"kind": "hyper", "n": 3}), 0, None, 2, [0, 1, 0, 1]),
    # value residual: every layer after the first mixes in layer 0's values, in every pass
    "value_residual": (mixer_config("causal", n_layer=3, attention={"value_residual": True}), 1, 3, 2, [0, 1, 2, 1, 2]),
}


def pair(name: str) -> tuple[Decoder, Decoder, ModelConfig]:
    """The looped model (float64, every weight random) and its unrolled reference, with the looped config."""
    base, start, end, passes, order = CASES[name]
    cfg = with_loop(base, start, end, passes)
    model = cast(Decoder, randomise(build_model(cfg, dtype=F64))).eval()
    reference = copied(model, build_model(unrolled(base, order), dtype=F64), order)
    return model, reference, cfg


def ids(cfg: ModelConfig, B: int = 2, T: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T or cfg.context_length), generator=g)


def padding(B: int, T: int) -> torch.Tensor:
    """Row 0 whole, row 1 left-padded by 3."""
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    return mask


@pytest.mark.parametrize("name", list(CASES))
def test_a_looped_model_is_the_unrolled_model_with_its_weights_copied(name):
    model, reference, cfg = pair(name)
    idx = ids(cfg)
    mask = padding(*idx.shape)
    with torch.no_grad():
        close(model(idx), reference(idx))
        close(model(idx, attention_mask=mask), reference(idx, attention_mask=mask))
        plain = build_model(CASES[name][0], dtype=F64).eval()  # the same weights run once: not the looped model
        plain.load_state_dict(model.state_dict())
        assert (plain(idx) - model(idx)).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_the_counts_are_the_held_layers_weights_and_the_unrolled_models_work(name):
    """Parameters: the model's without its loop; FLOPs per token and cache bytes: the unrolled model's."""
    base, start, end, passes, order = CASES[name]
    cfg, reference = with_loop(base, start, end, passes), unrolled(base, order)
    counts, held, work = count_params(cfg), count_params(base), count_params(reference)
    assert {k: v for k, v in counts.items() if k != "flops_per_token"} == {
        k: v for k, v in held.items() if k != "flops_per_token"
    }
    assert counts["flops_per_token"] == work["flops_per_token"] > held["flops_per_token"]
    assert kv_cache_bytes(cfg) == kv_cache_bytes(reference) > kv_cache_bytes(base)


@pytest.mark.parametrize("name", list(CASES))
def test_decoding_through_the_cache_is_the_whole_forward(name):
    """Each later pass keeps its own keys, values and states: a prefill, a chunk and single tokens, padded
    too, give the whole forward's logits; greedy generation equals re-running the whole sequence (no cache)."""
    model, _, cfg = pair(name)
    idx = ids(cfg)
    mask = padding(*idx.shape)
    with torch.no_grad():
        close(decode_in_pieces(model, idx, [5, 6, 9, 10, idx.shape[1]]), model(idx))
        pieces = decode_in_pieces(model, idx, [4, 7, 8, idx.shape[1]], mask)
        close(pieces[1, 3:], model(idx[1:, 3:])[0])
        prompt = idx[:, :4]
        expected = prompt
        for _ in range(6):
            expected = torch.cat([expected, model(expected)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generate(model, prompt, max_new_tokens=6), expected)


def test_a_padded_batch_generates_each_prompt_as_alone():
    model, _, _ = pair("gated_deltanet")
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4], [11, 3, 6, 2]]
    width = max(map(len, prompts))
    idx = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    together = generate(model, idx, max_new_tokens=6, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), max_new_tokens=6)
        assert together[row, width:].tolist() == alone[0, len(p) :].tolist(), row


def test_the_cache_holds_what_kv_cache_bytes_counts_per_pass():
    model, _, cfg = pair("gated_deltanet")
    cache = model.new_cache(1, cfg.context_length)
    with torch.no_grad():
        model(ids(cfg, B=1), cache)
    caches = [cache, *cache.passes.values()]
    assert len(caches) == 2  # pass 0 in the cache, pass 1 in its own
    held = sum(
        t.numel() for c in caches for t in (*c.k, *c.v, *c.conv_state, *c.recurrent_state, *c.shift) if t is not None
    )
    assert held * 8 == kv_cache_bytes(cfg, bytes_per_value=8)


PLAIN = [
    "model=nano",
    "model.vocab_size=48",
    "model.context_length=16",
    "model.n_layer=3",
    "model.d_model=32",
    "model.attention.n_head=4",
    "model/norm=rmsnorm",
    "model/position=none",
    "model.attention.qkv_bias=false",
    "model.attention.out_bias=false",
    "model.mlp.bias=false",
]


@functools.cache
def plain() -> ModelConfig:
    return compose_model(PLAIN)


def test_counts_by_hand_weights_once_flops_and_cache_per_pass():
    """3 layers of 4·d² attention, 8·d² MLP and 2 RMSNorms of d (d = 32), layers 1 and 2 run three times."""
    cfg = compose_model([*PLAIN, "model.layers.loop.start=1", "model.layers.loop.passes=3"])  # as typed
    d, V, T, H, hd = 32, 48, 16, 4, 8
    layer = 4 * d * d + 8 * d * d + 2 * d
    counts = count_params(cfg)
    assert counts["total"] == V * d + 3 * layer + d == 38_624  # tied head; the final norm
    assert counts["total"] == count_params(plain())["total"]
    runs = 3 + 2 * 2  # layer 0 once, layers 1 and 2 three times
    assert counts["flops_per_token"] == 6 * (counts["non_embedding"] + 2 * 2 * layer) + runs * 12 * H * hd * T
    assert counts["flops_per_token"] == 571_200
    assert kv_cache_bytes(cfg) == 4 * runs * 2 * H * hd * T == 28_672
    assert sum(p.numel() for p in build_model(cfg, device="meta").parameters()) == counts["total"]


def grad(model: Decoder, name: str) -> torch.Tensor:
    g = model.get_parameter(name).grad
    assert g is not None
    return g


def test_a_shared_weights_gradient_is_the_sum_of_its_copies_and_checkpointing_keeps_it():
    model, reference, cfg = pair("causal")
    order = CASES["causal"][4]
    idx = ids(cfg, T=9)
    for m in (model, reference):
        m.train()
        F.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    grads = dict(model.named_parameters())
    for name, p in reference.named_parameters():
        if not name.startswith("blocks."):
            close(p.grad, grads[name].grad)
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            i, rest = name.split(".", 2)[1:]
            copies = [grad(reference, f"blocks.{j}.{rest}") for j, k in enumerate(order) if k == int(i)]
            close(p.grad, torch.stack(copies).sum(0))
    kept = {n: grad(model, n).clone() for n, _ in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing = True
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    for n, p in model.named_parameters():
        close(p.grad, kept[n])


def test_a_looped_mixture_of_experts_averages_its_auxiliary_losses_over_the_passes():
    routing = {"n_experts": 4, "top_k": 2, "aux_loss_weight": 0.01, "z_loss_weight": 0.001}
    base = mixer_config(
        "causal", n_layer=2, mlp={"kind": "moe", "expert": "swiglu", "expert_d_ff": 16, "routing": routing}
    )
    order = [0, 1, 0, 1, 0, 1]
    model = cast(Decoder, randomise(build_model(with_loop(base, 0, None, 3), dtype=F64))).train()
    reference = copied(model, build_model(unrolled(base, order), dtype=F64), order).train()
    idx = ids(base)
    for m in (model, reference):
        m(idx)
    looped, expected = model.auxiliary_losses(), reference.auxiliary_losses()
    assert sorted(looped) == sorted(expected) and looped
    for name, (weight, loss) in expected.items():
        assert looped[name][0] == weight
        close(looped[name][1], loss)


def test_mup_groups_hold_each_shared_weight_once_as_without_the_loop():
    param = {"kind": "mup", "base_d_model": 16, "base_n_layer": None, "base_head_dim": None}
    optim = {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8}
    groups = []
    for cfg in (plain(), with_loop(plain(), 1, None, 4)):
        torch.manual_seed(0)
        model = build_model(cfg)
        optimizer = build_optimizer(model, optim, torch.device("cpu"), param=param)
        names = {id(p): n for n, p in model.named_parameters()}
        held = [id(p) for g in optimizer.param_groups for p in g["params"]]
        assert sorted(held) == sorted(names)  # each parameter in one group, once
        groups.append(
            [
                (g["lr"], g["weight_decay"], g["eps"], [names[id(p)] for p in g["params"]])
                for g in optimizer.param_groups
            ]
        )
    assert groups[0] == groups[1]


@pytest.mark.parametrize(
    "loop, field",
    [
        ((0, None, 0), "model.layers.loop.passes"),
        ((3, None, 2), "model.layers.loop.start"),
        ((-1, None, 2), "model.layers.loop.start"),
        ((2, 2, 2), "model.layers.loop.end"),
        ((0, 4, 2), "model.layers.loop.end"),
    ],
)
def test_a_bad_loop_is_one_error_naming_its_field(loop, field):
    with pytest.raises(ConfigError) as err:
        validate(with_loop(plain(), *loop))
    assert err.value.field == field
    assert "model.n_layer=3" in err.value.allowed or "positive integer" in err.value.allowed


def test_a_bad_loop_on_the_command_line_is_refused_as_composed():
    with pytest.raises(ConfigError, match="model.layers.loop.passes"):
        compose_model([*PLAIN, "model.layers.loop.passes=0"])


def test_a_value_residual_loop_starts_after_the_first_layer():
    residual = dataclasses.replace(plain(), attention=dataclasses.replace(plain().attention, value_residual=True))
    with pytest.raises(ConfigError) as err:
        validate(with_loop(residual, 0, None, 2))
    assert err.value.field == "model.layers.loop.start" and "value_residual" in err.value.allowed
    validate(with_loop(residual, 0, None, 1))  # no loop
    validate(with_loop(residual, 1, None, 2))


def test_a_range_set_with_one_pass_is_reported_ignored():
    """A sweep over passes from 1 sets start and end for every run: at 1 pass they are read by nothing."""
    one = with_loop(plain(), 1, 2, 1)
    assert [(i.field, i.value) for i in ignored(one)] == [("model.layers.loop.start", 1), ("model.layers.loop.end", 2)]
    assert "passes=1" in ignored(one)[0].why
    assert without_ignored(one) == plain()
    assert ignored(with_loop(plain(), 1, 2, 2)) == []


def test_check_says_the_loop_and_the_export_refuses_it():
    cfg = with_loop(plain(), 1, None, 3)
    assert "loop=layers 1-2 x3 (7 deep)" in _layout(cfg)
    assert "loop" not in _layout(plain())
    assert "loop=layer 1 x2 (4 deep)" in _layout(with_loop(cfg, 1, 2, 2))
    gpt2 = compose_model(["model=nano", "model.n_layer=3", "model.d_model=32", "model.attention.n_head=4"])
    assert exportability(gpt2)[1] == []
    family, problems = exportability(with_loop(gpt2, 1, None, 3))
    assert [(p.field, p.value) for p in problems] == [("model.layers.loop.passes", 3)]
    with pytest.raises(ConfigError, match="model.layers.loop.passes"):
        family.check(with_loop(gpt2, 1, None, 3))


def test_every_family_refuses_a_loop_whatever_its_layers():
    """Per-layer families check each layer's config, which has no loop: the loop is refused for the model."""
    gemma3 = compose_model(["model=gemma3-1b", "model.n_layer=6"])  # local and global layer kinds
    assert exportability(gemma3)[1] == []
    for cfg in (with_loop(gemma3, 2, 4, 2), with_loop(plain(), 0, None, 2)):
        held = [f for f in FAMILIES.values() if not f.mixer_problems(cfg)]
        assert len(held) > 20
        for family in held:
            assert "model.layers.loop.passes" in [p.field for p in family.problems(cfg)], family.title


@pytest.mark.slow  # a Lightning fit, about 4 s: the unit-level gradient test above runs in CI
def test_archlab_train_fits_a_looped_model_and_records_its_counts(tmp_path):
    from helpers.training import compose_train, tiny_config_dir

    from archlab.training.run import train

    loop = ["model.n_layer=2", "model.layers.loop.start=1", "model.layers.loop.passes=3"]
    common = ["trainer.max_steps=20", "trainer.val_check_interval=5", "callbacks.checkpoint.save_top_k=0"]
    summary = train(compose_train(tiny_config_dir(tmp_path / "conf"), tmp_path / "run", [*common, *loop]))
    assert summary["status"] == "completed"
    model = summary["model"]
    counts = count_params(model)
    unlooped = count_params({**model, "layers": {}})
    assert summary["flops_per_token"] == counts["flops_per_token"] > unlooped["flops_per_token"]
    assert summary["parameters"]["analytic"]["total"] == counts["total"]
    history = summary["metrics"]["history"]
    assert history[-1]["val/loss"] < history[0]["val/loss"]
    assert history[0]["val/acc"] < 0.5 and history[-1]["val/acc"] > 0.9  # the counting sequences learned
