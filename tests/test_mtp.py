"""Multi-token prediction (model.head.mtp): closed-form counts and FLOPs, the loss's wiring (which state,
which token, which target; none across packed documents), training through LitModel, and self-speculative
decoding equal to greedy decoding, its drafts equal to the modules run without a cache."""

import math

import pytest
import torch
import torch.nn.functional as F

from archlab import build_model, count_params
from archlab.config import model_config_dict, to_model_config
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.nn.loss import next_token_loss
from archlab.nn.model import document_ids, document_positions
from archlab.speculative import Drafting, speculate
from archlab.training.module import LitModel
from archlab.training.parametrization import roles

V, D_MODEL, HEADS = 16, 32, 4


def config(depth=2, **extra):
    base = {
        "vocab_size": V,
        "context_length": 64,
        "n_layer": 1,
        "d_model": D_MODEL,
        "attention": {"n_head": HEADS},
        "position": {"kind": "rope"},
        "head": {"mtp": {"depth": depth}},
    }
    return to_model_config({**base, **extra})


def randomised(cfg, seed=0):
    """A model with every weight drawn, norm scales and biases far from 1 and 0."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) * 0.3)
            else:
                p.copy_(torch.randn_like(p) * 0.3 + (1.5 if "norm" in name else 0.2))
    return model


def test_counts_and_flops_follow_the_closed_form():
    d, ff = D_MODEL, 4 * D_MODEL
    # by hand: a layernorm holds 2d; attention 4d² + 4d (biases); a GELU MLP 2·d·ff + ff + d; a pre block 2 norms
    block = (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + 2 * 2 * d
    module = 3 * 2 * d + 2 * d * d + block
    plain = dict(position={"kind": "learned"}, head={"mtp": {"depth": 0}})
    base, two = count_params(config(**plain)), count_params(config(**{**plain, "head": {"mtp": {"depth": 2}}}))
    assert two["mtp"] == 2 * module
    assert two["total"] == base["total"] + 2 * module and two["inference"] == base["total"]
    assert two["non_embedding"] == base["non_embedding"] and two["active"] == base["active"]
    T, hd = 64, d // HEADS
    # per module: 6 per weight, the tied head's matmul once more, attention's scores at T = context_length
    assert two["flops_per_token"] - base["flops_per_token"] == 2 * (6 * (module + V * d) + 12 * HEADS * hd * T)


def test_a_moe_layer_kind_counts_its_routed_experts_as_inactive():
    kinds = {"moe": {"mlp": {"kind": "moe", "d_ff": 8, "routing": {"n_experts": 4, "top_k": 1}}}}
    cfg = config(depth=1, layers={"kinds": kinds}, head={"mtp": {"depth": 1, "layer": "moe"}})
    model = build_model(cfg)  # build_model checks every component against the closed form
    held = sum(p.numel() for p in model.mtp.parameters())
    assert count_params(cfg)["mtp"] == held
    assert {type(m.block.mlp).__name__ for m in model.mtp.depths} == {"MoE"}


def test_the_loss_reads_the_final_state_the_next_tokens_and_the_shifted_targets():
    model = randomised(config(depth=1)).double()
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(2))
    model(idx, targets=targets)
    weight, loss = model.auxiliary_losses()["mtp_loss"]
    # by hand: [enorm(E[t_{i+1}]), hnorm(h_i)] -> eh_proj -> block -> norm -> tied head, against targets[i+1]
    m = model.mtp.depths[0]
    h = model.final_norm(
        model.blocks[0](model.tok_emb(idx), model.position.rotary(torch.arange(12), torch.float64), None, None)
    )
    x = m.eh_proj(torch.cat((m.enorm(model.tok_emb(idx[:, 1:])), m.hnorm(h[:, :-1])), dim=-1))
    rot = model.position.rotary(torch.arange(11), torch.float64)
    from archlab.nn.mixers.base import attention_mask

    mask = attention_mask(torch.arange(11), torch.arange(11), None)
    y = m.norm(m.block(x, rot, mask, None))
    expected = F.cross_entropy((y @ model.tok_emb.weight.T).flatten(0, 1), targets[:, 1:].flatten())
    assert weight == 0.3
    torch.testing.assert_close(loss, expected.float())  # the loss is computed in float32


def test_no_prediction_crosses_a_packed_document():
    eos = 0
    model = randomised(config(depth=1), seed=3).double()
    a = torch.tensor([5, 7, 2, 9, 4, eos])
    b = torch.tensor([3, 8, 6, 1, 11, 12, 13])
    packed = torch.cat((a, b))[None]
    targets = torch.cat((packed[0, 1:], torch.tensor([14])))[None]
    docs = document_ids(packed, eos)
    model(packed, document_ids=docs, position_ids=document_positions(docs), targets=targets)
    packed_loss = model.auxiliary_losses()["mtp_loss"][1]
    sums = []
    for row, row_targets in ((a, targets[0, :6]), (b, targets[0, 6:])):
        model(row[None], targets=row_targets[None])
        sums.append(model.auxiliary_losses()["mtp_loss"][1] * (len(row) - 1))
    # depth 1 scores positions i < T - 1 whose token i + 1 is of their document: 5 in a, 6 in b
    torch.testing.assert_close(packed_loss * 11, sums[0] + sums[1])


def test_training_adds_the_weighted_loss_and_reaches_every_module():
    lit = LitModel(model_config_dict(config(depth=2)), {"kind": "adamw", "lr": 1e-3}, {"kind": "constant"})
    lit.configure_model()
    idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    targets = idx.roll(-1, 1)
    logged = {}
    lit.log = lambda name, value, **kw: logged.__setitem__(name, value)  # no Trainer: record what it logs
    lit.optimizers = lambda: torch.optim.SGD(lit.model.parameters(), lr=0.1)
    loss = lit.training_step((idx, targets), 0)
    main = next_token_loss(lit.model(idx), targets)
    torch.testing.assert_close(loss, main + 0.3 * logged["train/mtp_loss"])
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lit.model.mtp.parameters())
    assert all(math.isfinite(float(torch.as_tensor(v).detach())) for v in logged.values())
    assert set(roles(lit.model, "mup")) >= {id(m.eh_proj.weight) for m in lit.model.mtp.depths}


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"model\.head\.mtp\.layer"):
        build_model(config(head={"mtp": {"depth": 1, "layer": "dense"}}))
    with pytest.raises(ConfigError, match=r"model\.head\.mtp\.depth"):
        build_model(config(head={"mtp": {"depth": -1}}))
    with pytest.raises(ConfigError, match=r"model\.head\.mtp\.weight"):
        build_model(config(head={"mtp": {"depth": 1, "weight": 0.0}}))
    model = build_model(config(depth=0))
    with pytest.raises(ConfigError, match=r"model\.head\.mtp\.depth"):
        speculate(model, torch.zeros(1, 3, dtype=torch.long), 4)
    model = build_model(config(depth=2))
    with pytest.raises(ConfigError, match="max_new_tokens"):
        speculate(model, torch.zeros(1, 3, dtype=torch.long), 60)


def initialised(cfg, seed):
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.init_weights()
    return model


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": {"kind": "mhc", "n": 4}},
        {"stream": {"kind": "hyper", "n": 2}},
        {"attention": {"n_head": HEADS, "value_residual": True}},
    ],
    ids=["mhc", "hyper", "value_residual"],
)
def test_the_modules_run_on_one_stream_without_value_residual(extra):
    """A module reads the merged, normed state: its block is the plain-stream model's, parameters and all,
    and it trains and drafts greedy decoding's tokens beside the model's streams or value mixes."""
    cfg = config(depth=2, **extra)
    assert count_params(cfg)["mtp"] == count_params(config(depth=2))["mtp"]
    model = randomised(cfg, seed=2)
    idx = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(3))
    model(idx, targets=idx.roll(-1, 1))
    model.auxiliary_losses()["mtp_loss"][1].backward()
    assert all(p.grad is not None for p in model.mtp.parameters())
    prompt = idx[:, :4]
    model.eval()
    assert torch.equal(speculate(model, prompt, 12).ids, generate(model, prompt, 12, temperature=0.0))


def trained_on_a_cycle(depth=2, steps=60, **extra):
    """A model that has learnt a period-12 sequence: its modules' drafts are mostly right."""
    model = initialised(config(depth=depth, **extra), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    period = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        rows = torch.stack([period.roll(-int(o)).repeat(3)[:33] for o in torch.randint(0, 12, (4,), generator=gen)])
        loss = next_token_loss(model(rows[:, :-1], targets=rows[:, 1:]), rows[:, 1:])
        loss = loss + sum(w * aux for w, aux in model.auxiliary_losses().values())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def drafts_without_a_cache(model, tokens):
    """The modules' drafts after ``tokens``, each module run over the whole sequence from scratch."""
    state, known, out = model.hidden(tokens)[:, :-1], tokens, []
    for k, m in enumerate(model.mtp.depths, start=1):
        n = state.shape[1]
        x = m.enter(model.embed(known[:, k : k + n]), state)
        state = m.norm(model.run(x, [(m.block, model.mtp_position, None)], None, None, None, None))
        out.append(model.logits(state[:, -1:]).argmax(-1))
        known = torch.cat((known, out[-1]), dim=1)
    return torch.cat(out, dim=1)


@pytest.fixture(scope="module")
def cycle_model():
    return trained_on_a_cycle()


def test_speculative_decoding_keeps_drafts_and_equals_greedy(cycle_model, monkeypatch):
    checked = []
    draft = Drafting.draft

    def checking(self, tokens, pending):
        drafts, rest = draft(self, tokens, pending)
        if self.mask is None:  # the cache-free reference has no padding
            torch.testing.assert_close(drafts, drafts_without_a_cache(self.model, tokens), rtol=0, atol=0)
            checked.append(tokens.shape[1])
        return drafts, rest

    monkeypatch.setattr(Drafting, "draft", checking)
    prompt = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    done = speculate(cycle_model, prompt, 30)
    assert torch.equal(done.ids, generate(cycle_model, prompt, 30, temperature=0.0))
    assert done.accepted > done.drafted // 2 and done.rounds < 20 and len(checked) == done.rounds
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    padded = speculate(cycle_model, prompt, 30, attention_mask=mask)
    assert torch.equal(padded.ids, generate(cycle_model, prompt, 30, temperature=0.0, attention_mask=mask))


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"attention": {"n_head": HEADS, "window": 4}},
        {"attention": {"kind": "gated_deltanet", "n_head": HEADS}, "position": {"kind": "none"}},
        {"n_layer": 2, "attention": {"n_head": HEADS, "window": 4}, "layers": {"loop": {"passes": 2}}},
    ],
    ids=["global", "window", "recurrent", "looped"],
)
def test_rejected_drafts_take_every_cache_back(extra, padded, monkeypatch):
    """Drafts replaced by greedy decoding's tokens, one of them wrong in some rounds: rounds keep a part of
    them, so the model's cache is cut back (global layers) or restored and fed again (a window, a state);
    the modules' own drafts, where unpadded, equal them run without a cache (their cache restored too)."""
    model = randomised(config(depth=3, **extra), seed=1)  # large weights: every token depends on the context
    prompt = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]]) if padded else None
    greedy = generate(model, prompt, 24, temperature=0.0, attention_mask=mask)
    draft, verify, kept = Drafting.draft, Drafting.verify, []

    def oracle(self, tokens, pending):
        drafts, rest = draft(self, tokens, pending)
        if not padded:
            torch.testing.assert_close(drafts, drafts_without_a_cache(self.model, tokens), rtol=0, atol=0)
        N = tokens.shape[1]
        right = greedy[:, N : N + self.depth]
        right = torch.cat((right, right.new_zeros(2, self.depth - right.shape[1])), dim=1)
        wrong = len(kept) % (self.depth + 1)  # by round: the first, second, third draft wrong, or none
        if wrong < self.depth:
            right[:, wrong] = (right[:, wrong] + 1) % V
        return right, rest

    def counting(self, tokens, drafts, remaining):
        out = verify(self, tokens, drafts, remaining)
        kept.append(out[0].shape[1] - 1)
        # the states the modules read next equal the model's over the whole sequence, without a cache
        whole = torch.cat((tokens, out[0][:, :-1]), dim=1)
        columns = None if self.mask is None else self.mask[:, : whole.shape[1]]
        expected = self.model.hidden(whole, attention_mask=columns)[:, tokens.shape[1] - 1 :]
        torch.testing.assert_close(out[1], expected, rtol=1e-5, atol=1e-5)
        return out

    monkeypatch.setattr(Drafting, "draft", oracle)
    monkeypatch.setattr(Drafting, "verify", counting)
    done = speculate(model, prompt, 24, attention_mask=mask)
    assert torch.equal(done.ids, greedy)
    assert {0, 1, 2, 3} <= set(kept)  # none, a part and all of the drafts kept


def test_deepseek_v3_s_module_counts_as_published():
    """DeepSeek-V3 with its one MTP module: the module's unique parameters are those of transformers'
    MtpModel built on the published config (11,610,067,968: a MoE decoder block, eh_proj and three norms;
    the embedding and head shared), beside the 671,026,404,352 of DeepseekV3ForCausalLM."""
    from archlab import compose_model

    counts = count_params(compose_model(["model=deepseek-v3", "model.head.mtp.depth=1"]))
    assert counts["mtp"] == 11_610_067_968
    assert counts["inference"] == 671_026_404_352
    assert counts["total"] == 671_026_404_352 + 11_610_067_968
