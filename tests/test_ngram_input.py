"""Hashed n-gram inputs (``model.ngram_input``, Qwen4-Exp's PLE): the n-gram ids equal transformers'
``Qwen4ExpTextNGramEmbedding``'s on random tokens thick with document ends, whole and decoded in pieces
through its cache; one layer's input equals ``Qwen4ExpTextPLELayer``'s (every weight randomised, float32),
whole, in pieces, and with padding; the table sizes and hash multipliers by hand; the count in closed form;
the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise

from archlab import ConfigError, build_model, compose_model
from archlab.nn.ngram_embedding import head_sizes, multipliers
from archlab.nn.ngram_input import NGramInput, layer_params, table_params

pytestmark = pytest.mark.usefixtures("single_thread")

D, N, V, EOS = 32, 4, 64, 5
NGRAM = [
    "model=nano",
    f"model.d_model={D}",
    "model.n_layer=4",
    "model.attention.n_head=4",
    f"model.vocab_size={V}",
    "model/stream=gated",
    f"model.stream.n={N}",
    "model.stream.rank=12",
    "model/norm=rmsnorm",
    "model.norm.eps=1e-6",
    "model.norm.unit_offset=true",
    "model.ngram_input.layers=[0,2]",
    "model.ngram_input.heads=4",
    "model.ngram_input.table_base=1000",
    "model.ngram_input.table_multiple=16",
    f"model.ngram_input.boundary={EOS}",
]


def _hf_config(order: int = 3, kernel: int = 4):
    transformers = pytest.importorskip("transformers")
    return transformers.Qwen4ExpTextConfig(
        hidden_size=D,
        hc_count=N,
        hc_lowrank=12,
        num_hidden_layers=4,
        num_attention_heads=4,
        vocab_size=V,
        ple_layer_ids=[1, 3],
        ple_embed_dim=D,
        heads_per_ngram=4,
        ngram_size=order,
        ple_conv_kernel_size=kernel,
        ngram_vocab_size_base=1000,
        make_ngram_vocab_size_divisible_by=16,
        eos_token_id=EOS,
        rms_norm_eps=1e-6,
    )


def _tokens(seed: int, shape=(3, 17)) -> torch.Tensor:
    """Random ids, about one in four the document end."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, shape, generator=g)
    return torch.where(torch.rand(shape, generator=g) < 0.25, EOS, tokens)


def _pair(order: int = 3, kernel: int = 4, seed: int = 1):
    """Ours and transformers' input of layer 2 (the second with one), the same random weights."""
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextPLELayer

    cfg = compose_model([*NGRAM, f"model.ngram_input.order={order}", f"model.ngram_input.conv_kernel={kernel}"])
    ours = randomise(NGramInput(cfg, 1), seed=seed)
    theirs = Qwen4ExpTextPLELayer(_hf_config(order, kernel), 2, 1)
    with torch.no_grad():
        theirs.ple_embedding.ngram_embedding.weight.copy_(ours.embedding.table.weight)
        theirs.key_proj.weight.copy_(ours.key.weight)
        theirs.value_proj.weight.copy_(ours.value.weight)
        for name in ("norm_key", "norm_query", "norm_conv"):
            getattr(theirs, name).weight.copy_(getattr(ours, name).flatten())
        theirs.conv1d.weight.copy_(ours.conv.unsqueeze(1))
    return ours, theirs


def _recorded(theirs) -> list[torch.Tensor]:
    """The row ids transformers' table is read at, call after call."""
    seen: list[torch.Tensor] = []
    theirs.ple_embedding.ngram_embedding.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    return seen


def test_the_constants_are_worked_by_hand():
    """The primes from 1000: 1009, 1013, 1019, 1021, 1031, ... (table 1 starts after table 0's 8); the
    multipliers odd and below 2⁶³ / vocab."""
    assert head_sizes(1000, 8, 0)[:4] == [1009, 1013, 1019, 1021]
    assert head_sizes(1000, 8, 1) == [1051, 1061, 1063, 1069, 1087, 1091, 1093, 1097]
    m = multipliers(V, 3, 1, 1234)
    assert all(x % 2 == 1 and 0 < x < 2**63 // V for x in m) and len(set(m)) == 3


@pytest.mark.parametrize("order", [2, 3, 5])
def test_the_ids_are_transformers_whole_and_decoded_in_pieces(order):
    """Random tokens, a quarter document ends: the rows read equal transformers' exactly, whole and fed in
    pieces through its cache (the first piece shorter than the context), ours carrying its state."""
    from transformers import DynamicCache

    ours, theirs = _pair(order)
    seen = _recorded(theirs)
    tokens = _tokens(2)
    theirs.ple_embedding(tokens, None)
    assert torch.equal(
        ours.embedding.ids(torch.cat([ours.empty_state(3, tokens.device, torch.float32).tokens, tokens], 1), EOS)[
            :, order - 1 :
        ],
        seen[-1],
    )
    cache, state, pieces = DynamicCache(config=_hf_config(order)), None, []
    for start, end in [(0, 1), (1, 5), (5, 6), (6, 7), (7, 17)]:
        theirs.ple_embedding(tokens[:, start:end], cache)
        h = torch.randn(3, end - start, N, D)
        _, state = ours(h, tokens[:, start:end], state)
        history = state.tokens
        pieces.append(seen[-1])
        assert torch.equal(history, torch.cat([torch.full((3, order - 1), EOS), tokens[:, :end]], 1)[:, -(order - 1) :])
    assert torch.equal(torch.cat(pieces, 1), seen[0])


def test_an_ngram_never_crosses_a_document_end():
    """By hand, bigrams and trigrams: after the end token 5 a token's n-grams restart (the end token's own
    do not), so two documents' same tokens read the same rows."""
    ours, _ = _pair()
    context = torch.full((1, 2), EOS)
    a = ours.embedding.ids(torch.cat([context, torch.tensor([[7, 8, 9, EOS, 7, 8, 9]])], 1), EOS)[:, 2:]
    assert torch.equal(a[0, :3], a[0, 4:])
    assert not torch.equal(a[0, 3], ours.embedding.ids(torch.tensor([[EOS, EOS, EOS]]), EOS)[0, 2])


@pytest.mark.parametrize("kernel", [2, 3, 4])
def test_a_layers_input_is_transformers_whole_and_in_pieces(kernel):
    """Streams and tokens through one layer's input: ours equals transformers' ``Qwen4ExpTextPLELayer``
    (float32, every weight random) whole, and in pieces through its cache and our state."""
    from transformers import DynamicCache

    ours, theirs = _pair(kernel=kernel, seed=3)
    tokens = _tokens(4)
    h = torch.randn(3, 17, N, D, generator=torch.Generator().manual_seed(5)) * 2
    whole, _ = ours(h, tokens)
    expected = theirs(h.flatten(-2), tokens, None)
    torch.testing.assert_close(whole.flatten(-2), expected, rtol=1e-5, atol=1e-5)
    cache, state, pieces = DynamicCache(config=_hf_config(kernel=kernel)), None, []
    for start, end in [(0, 2), (2, 3), (3, 4), (4, 11), (11, 17)]:
        out, state = ours(h[:, start:end], tokens[:, start:end], state)
        torch.testing.assert_close(
            out.flatten(-2), theirs(h[:, start:end].flatten(-2), tokens[:, start:end], cache), rtol=1e-5, atol=1e-5
        )
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-5, atol=1e-5)


def test_padding_reads_as_the_document_end_and_adds_nothing():
    """Left padding: transformers' model hands the layer the end token there and its mask; ours, given the
    mask, equals that, and a padded row's tokens gain what they gain alone."""
    ours, theirs = _pair(seed=6)
    tokens = _tokens(7)
    present = torch.ones(3, 17, dtype=torch.bool)
    present[0, :5] = False
    h = torch.randn(3, 17, N, D, generator=torch.Generator().manual_seed(8))
    got, _ = ours(h, tokens, present=present)
    expected = theirs(h.flatten(-2), torch.where(present, tokens, EOS), None, conv_mask=present.long())
    torch.testing.assert_close(got.flatten(-2), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0, :5], torch.zeros_like(got[0, :5]))
    alone, _ = ours(h[:1, 5:], tokens[:1, 5:])
    torch.testing.assert_close(got[:1, 5:], alone, rtol=1e-5, atol=1e-5)


def test_the_count_is_the_closed_form_and_transformers():
    """Two tables of 8 primes each, rounded up to 16, × 4 columns; per layer keys 32 × 128, value 32 × 32,
    three norm scales 128 and the convolution 128 × 4: transformers' layers hold the same."""
    cfg = compose_model(NGRAM)
    rows = [-(-sum(head_sizes(1000, 8, 0)) // 16) * 16, -(-sum(head_sizes(1000, 8, 1)) // 16) * 16]
    assert table_params(cfg) == 4 * sum(rows)
    assert layer_params(cfg) == 32 * 128 + 32 * 32 + 3 * 128 + 128 * 4 == 6_016
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextPLELayer

    theirs = [Qwen4ExpTextPLELayer(_hf_config(), i, k) for k, i in enumerate([0, 2])]
    total = sum(p.numel() for m in theirs for p in m.parameters())
    assert total == table_params(cfg) + 2 * layer_params(cfg)
    for k, module in enumerate(theirs):
        assert NGramInput(cfg, k).embedding.table.weight.shape == module.ple_embedding.ngram_embedding.weight.shape


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.ngram_input.layers=[0,4]"], "model.ngram_input.layers"),
        (["model.ngram_input.layers=[1,1]"], "model.ngram_input.layers"),
        (["model.ngram_input.order=1"], "model.ngram_input.order"),
        (["model.ngram_input.dim=20"], "model.ngram_input.dim"),
        (["model.ngram_input.boundary=null"], "model.ngram_input.boundary"),
        (["model.ngram_input.conv_kernel=0"], "model.ngram_input.conv_kernel"),
        (["model/stream=altup"], "model.ngram_input.layers"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*NGRAM, *overrides])
    assert err.value.field == field


@pytest.mark.parametrize("stream", [[], ["model/stream=plain"]])
def test_a_model_with_ngram_inputs_counts_trains_and_decodes_in_pieces_as_whole(stream):
    """On gated streams and on one plain stream: the closed-form count is the built model's, component by
    component; a few AdamW steps lower the loss; with every weight randomised, logits decoded through the
    cache in pieces equal the whole sequence's, and a left-padded row's equal its own alone."""
    from helpers.mixers import check_trains_then_decodes_in_pieces, decode_in_pieces

    from archlab.accounting import check_build

    cfg = compose_model([*NGRAM, *stream])
    torch.manual_seed(0)
    model = build_model(cfg)
    check_build(cfg, model)
    idx = _tokens(9, (4, 24))
    check_trains_then_decodes_in_pieces(model, idx, [1, 10, 11, 12, 24])
    with torch.no_grad():
        padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), idx[:1, :19]], 1)
        mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 19, dtype=torch.long)], 1)
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 5:], model(idx[:1, :19]), rtol=1e-4, atol=1e-4)
        cached = decode_in_pieces(model, padded, [8, 9, 24], mask)
        torch.testing.assert_close(cached[:, 5:], model(idx[:1, :19]), rtol=1e-4, atol=1e-4)


def test_a_restored_cache_decodes_as_before():
    """Speculative decoding's rollback: the n-gram states are in the snapshot, so after a restore the same
    tokens give the same logits; the cache is not truncatable by its length alone."""

    model = randomise(build_model(compose_model(NGRAM)), seed=10).eval()
    idx = _tokens(11, (2, 16))
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(idx[:, :10], cache)
        taken = cache.snapshot()
        first = model(idx[:, 10:13], cache)
        cache.restore(taken)
        model(torch.flip(idx[:, 10:13], [1]), cache)  # another continuation, then back again
        cache.restore(taken)
        again = model(idx[:, 10:13], cache)
    assert not cache.truncatable()
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_packed_documents_are_each_their_own():
    """A row of two documents packed (``document_ids``) gives each document's logits as it gives them alone:
    neither the n-grams nor the convolution reach across; the same row unpacked does differ (the convolution
    and n-grams do reach across without the ids)."""

    model = randomise(build_model(compose_model(NGRAM)), seed=12).eval()
    idx = torch.where(_tokens(13, (1, 20)) == EOS, 7, _tokens(13, (1, 20)))  # no end token: only the ids part them
    documents = torch.tensor([[0] * 9 + [1] * 11])
    with torch.no_grad():
        positions = torch.cat([torch.arange(9), torch.arange(11)])[None]  # learned positions: each from 0
        packed = model(idx, document_ids=documents, position_ids=positions)
        torch.testing.assert_close(packed[:, :9], model(idx[:, :9]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed[:, 9:], model(idx[:, 9:]), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(model(idx)[:, 9:], model(idx[:, 9:]), rtol=1e-3, atol=1e-3)


def test_the_decoding_state_is_counted_in_the_kv_cache_bytes():
    """kv_cache_bytes adds, per layer with an n-gram input, what its NGramState holds after decoding: the
    tokens and convolution inputs measured in the cache equal the closed form's part."""
    import dataclasses

    from archlab.accounting import kv_cache_bytes

    cfg = compose_model(NGRAM)
    model = build_model(cfg).eval()
    cache = model.new_cache(2, 12)
    with torch.no_grad():
        model(_tokens(3, (2, 12)), cache)
    held = sum(t.nbytes for state in cache.ngram if state is not None for t in state)
    without = dataclasses.replace(cfg, ngram_input=dataclasses.replace(cfg.ngram_input, layers=[]))
    assert held == 2 * (kv_cache_bytes(cfg, 12) - kv_cache_bytes(without, 12)) > 0
