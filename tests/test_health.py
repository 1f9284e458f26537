"""Per-layer health (``callbacks.health``): the block-output RMS against the coordinate check's, the
attention entropy and largest logit against an explicit float64 softmax that reproduces the mixer's output,
the gradient norms per block and per μP role and the update/weight ratio against direct computations on a tiny
model, the callback's steps, file and resume through a LitModel, its refusal, and the report's heatmaps from
hand-written run directories."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Optional, cast

import pytest
import torch
import torch.nn.functional as F
from helpers.report_runs import job, report

from archlab import build_model
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.mixers import base
from archlab.nn.mixers.base import Mixer
from archlab.nn.mixers.mla import MultiHeadLatentAttention
from archlab.report.health import health_matrix, health_rows, read_health
from archlab.report.runs import group_variants, load_runs, swept_axes
from archlab.training.coordcheck import activation_rms
from archlab.training.health import LayerHealth, Probe
from archlab.training.module import LitModel
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

MODEL = {
    "vocab_size": 32,
    "context_length": 16,
    "n_layer": 2,
    "d_model": 16,
    "attention": {"n_head": 2},
    "head": {"tied": False},
}
BATCH = torch.randint(0, 32, (4, 13), generator=torch.Generator().manual_seed(0))


def norm(tensors) -> float:
    return float(torch.sqrt(sum(t.double().square().sum() for t in tensors)))


def test_rms_grad_norms_and_update_ratios_equal_direct_computations():
    cfg = to_model_config(MODEL)
    torch.manual_seed(0)
    expected_rms = activation_rms(cfg, {"kind": "sp"}, BATCH, steps=0, lr=1e-2)[0]  # the coordinate check's
    torch.manual_seed(0)
    model = build_model(cfg)
    probe = Probe(model, roles(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe.watch()
    F.cross_entropy(model(BATCH[:, :-1]).flatten(0, 1), BATCH[:, 1:].flatten()).backward()
    figures = probe.gradients()
    assert figures["rms"] == pytest.approx({"0": expected_rms["block 0"], "1": expected_rms["block 1"]}, rel=1e-6)

    grads = {n: p.grad for n, p in model.named_parameters()}
    for i in ("0", "1"):
        assert figures["grad_norm"][i] == pytest.approx(
            norm(g for n, g in grads.items() if n.startswith(f"blocks.{i}."))
        )
    assert figures["grad_norm"]["other"] == pytest.approx(
        norm(g for n, g in grads.items() if not n.startswith("blocks."))
    )
    by_role = {  # the roles by shape: matrices inside the blocks hidden, tables and the head input, 1-d vectors
        "hidden": [g for n, g in grads.items() if n.startswith("blocks.") and g.dim() == 2],
        "input": [g for n, g in grads.items() if not n.startswith("blocks.") and g.dim() == 2],
        "vector": [g for g in grads.values() if g.dim() == 1],
    }
    assert figures["grad_norm_role"] == pytest.approx({k: norm(v) for k, v in by_role.items()})

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    ratios = probe.updates()
    for i in ("0", "1"):
        names = [n for n in before if n.startswith(f"blocks.{i}.")]
        change = norm(dict(model.named_parameters())[n].detach() - before[n] for n in names)
        assert ratios["update_ratio"][i] == pytest.approx(change / norm(before[n] for n in names))
    assert set(ratios["update_ratio_role"]) == {"hidden", "input", "vector"}


def test_no_hook_outside_the_watched_steps():
    model = build_model(to_model_config(MODEL))
    probe = Probe(model, roles(model))
    probe.watch()
    model(BATCH[:, :-1]).sum().backward()
    probe.gradients()
    assert all(not block._forward_hooks for block in model.blocks)
    model(BATCH[:, :-1])
    figures = probe.gradients()
    assert figures["rms"] == figures["attn_entropy"] == {}  # nothing seen since


SCORED = {  # a sliding window over GQA heads with QK-norm and RoPE; ALiBi's bias, soft-capping and sinks; mla;
    # parallel's attention part
    "gqa window": {"n_head": 4, "n_kv_head": 2, "window": 5, "qk_norm": "head"},
    "alibi softcap sinks": {"n_head": 2, "softcap": 0.5, "sinks": True},
    "mla": {
        "kind": "mla",
        "n_head": 2,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 4,
        "v_head_dim": 4,
    },
    "parallel": {  # the attention part's, of its input scaled by 0.75
        "kind": "parallel",
        "n_head": 2,
        "attention_in_multiplier": 0.75,
        "ssm": {"kind": "mamba2", "n_head": 2, "head_dim": 8, "state_size": 4, "scan_chunk": 4},
    },
}


def explicit_softmax(attn: Any, x, rotary, mask, out) -> tuple[float, float]:
    """The entropy and largest logit of queries 11, 7 and 3 from ``attn``'s queries and keys of ``x``,
    scored, masked and softmaxed by hand, after checking that those weights reproduce its output ``out``."""
    if isinstance(attn, MultiHeadLatentAttention):
        q, _ = attn.queries(x, rotary)
        k, v = attn.keys_values(*attn.latents(x, rotary))
    else:
        q, k, v = (t.transpose(1, 2) for t in attn.project(x, rotary))
        k, v = (t.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1) for t in (k, v))
    T = x.shape[1]
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * attn.scale
    softcap: Optional[float] = getattr(attn, "softcap", None)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else scores + mask
    sinks = getattr(attn, "sinks", None)
    if sinks is not None:
        scores = torch.cat((scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)
    weights = torch.softmax(scores, dim=-1)
    y = torch.einsum("bhqk,bhkd->bqhd", weights[..., :T], v).flatten(2)
    torch.testing.assert_close(attn.proj(y), out)  # the hand-made softmax is the forward's
    rows = [11, 7, 3]
    p, s = weights[:, :, rows], scores[:, :, rows]
    entropy = -torch.where(p > 0, p * p.log(), torch.zeros(())).sum(-1).mean()
    return float(entropy), float(s[s.isfinite()].max())


@pytest.mark.parametrize("case", list(SCORED))
def test_attention_entropy_and_max_logit_equal_an_explicit_float64_softmax(case, monkeypatch):
    """The scores of every 4th query counting back from the last (SAMPLED_QUERIES=3 of 12), from the
    float64 model's queries and keys, masked and softmaxed by hand: the weights reproduce the mixer's
    output (so they are the forward's), and their entropy and largest logit are the probe's."""
    monkeypatch.setattr(base, "SAMPLED_QUERIES", 3)
    position = "alibi" if "alibi" in case else "rope"
    model = build_model(to_model_config({**MODEL, "position": {"kind": position}, "attention": SCORED[case]}))
    model.double()
    attn: Any = model.blocks[1].attn
    attn = attn.attention if case == "parallel" else attn  # the part the parallel mixer's figures are of
    seen = {}
    attn.register_forward_hook(lambda m, inputs, out: seen.update(inputs=inputs, out=out))
    probe = Probe(model, roles(model))
    probe.watch()
    model(BATCH[:, :-1]).sum().backward()
    figures = probe.gradients()
    with torch.no_grad():  # the reference
        x, rotary, mask = seen["inputs"][:3]
        reference = explicit_softmax(attn, x, rotary, mask, seen["out"])
    assert figures["attn_entropy"]["1"] == pytest.approx(reference[0], rel=1e-5)
    assert figures["attn_max_logit"]["1"] == pytest.approx(reference[1], rel=1e-5)
    assert set(figures["attn_entropy"]) == set(figures["attn_max_logit"]) == {"0", "1"}


def test_a_recurrent_mixer_gives_no_attention_figures():
    """A gated_deltanet layer then a causal one: only the causal block has an entropy and a largest logit."""
    gdn = {"kind": "gated_deltanet", "n_head": 2, "key_heads": 2, "key_head_dim": 8, "v_head_dim": 8}
    layers = {"kinds": {"deltanet": {"attention": gdn}, "attention": {}}, "pattern": ["deltanet", "attention"]}
    model = build_model(to_model_config({**MODEL, "position": {"kind": "rope"}, "layers": layers}))
    assert cast(Mixer, model.blocks[0].attn).score_stats(torch.zeros(1, 4, 16)) is None
    probe = Probe(model, roles(model))
    probe.watch()
    model(BATCH[:, :-1]).sum().backward()
    figures = probe.gradients()
    assert set(figures["attn_entropy"]) == set(figures["attn_max_logit"]) == {"1"}
    assert 0 < figures["attn_entropy"]["1"] < torch.log(torch.tensor(12.0))


def fake_trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step, is_global_zero=True, strategy=SimpleNamespace(reduce=lambda t, reduce_op: t)
    )


def test_the_callback_writes_every_kth_step_and_a_resume_drops_the_later_lines(tmp_path):
    lit = LitModel(MODEL, optim={}, scheduler={})
    lit.configure_model()
    logged = {}
    lit.log_dict = logged.update  # pyright: ignore[reportAttributeAccessIssue]
    optimizer = torch.optim.SGD(lit.decoder.parameters(), lr=0.1)
    callback = LayerHealth(every_n_steps=2, dirpath=tmp_path)
    callback.on_fit_start(fake_trainer(0), lit)  # pyright: ignore[reportArgumentType]
    for step in range(5):  # optimizer steps 1..5
        callback.on_train_batch_start(fake_trainer(step), lit, None, 0)  # pyright: ignore[reportArgumentType]
        optimizer.zero_grad()
        lit.decoder(BATCH[:, :-1]).square().mean().backward()
        callback.on_before_optimizer_step(fake_trainer(step), lit, optimizer)  # pyright: ignore[reportArgumentType]
        optimizer.step()
        callback.on_train_batch_end(fake_trainer(step + 1), lit, None, None, 0)  # pyright: ignore[reportArgumentType]
    records = [json.loads(line) for line in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert set(records[0]) == {"step", "rms", "attn_entropy", "attn_max_logit"} | {
        "grad_norm",
        "grad_norm_role",
        "update_ratio",
        "update_ratio_role",
    }
    assert set(records[0]["attn_entropy"]) == set(records[0]["attn_max_logit"]) == {"0", "1"}
    assert set(records[0]["rms"]) == {"0", "1"} and set(records[0]["grad_norm"]) == {"0", "1", "other"}
    assert logged["health/rms/1"] == records[1]["rms"]["1"]
    assert logged["health/attn_entropy/0"] == records[1]["attn_entropy"]["0"]
    assert callback.summary_fields()["health"]["steps"] == 2
    resumed = LayerHealth(every_n_steps=2, dirpath=tmp_path)
    resumed.on_fit_start(fake_trainer(3), lit)  # pyright: ignore[reportArgumentType]
    assert [json.loads(line)["step"] for line in (tmp_path / "health.jsonl").read_text().splitlines()] == [2]


@pytest.mark.parametrize("every", [-1, 2.5, True])
def test_a_bad_interval_is_refused_naming_the_field(every):
    with pytest.raises(ConfigError) as err:
        LayerHealth(every_n_steps=every)
    assert err.value.field == "callbacks.health.every_n_steps"


def test_off_by_default_records_nothing(tmp_path):
    callback = LayerHealth(dirpath=tmp_path)
    assert callback.every_n_steps == 0 and callback.summary_fields() == {}


def write_health(run, layers: int, steps: list[int], scale: float) -> None:
    """A health.jsonl: block b's figures at step s are scale·(b + 1)·s, the largest logit its negative."""
    lines = []
    for s in steps:
        values = {str(b): scale * (b + 1) * s for b in range(layers)}
        attention = {"attn_entropy": values, "attn_max_logit": {b: -v for b, v in values.items()}}
        lines.append(
            {"step": s, "rms": values, **attention, "grad_norm": {**values, "other": 1.0}, "update_ratio": values}
        )
    (run / "health.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_report_draws_a_layer_by_step_heatmap_per_variant(tmp_path):
    """Two variants (2 and 3 blocks), the first with two seeds whose records differ by a factor 3 and share
    steps 10 and 20 of 10, 20, 30: its matrix is blocks × shared steps, the mean over seeds; one PNG per
    figure, all in one PNG listed in report.md, the attention's rows (a negative logit too) drawn linear."""
    a1 = job(tmp_path, ["model.n_layer=2", "seed=0"], [2.0])
    a2 = job(tmp_path, ["model.n_layer=2", "seed=1"], [2.1])
    b = job(tmp_path, ["model.n_layer=3", "seed=0"], [1.9])
    write_health(a1, 2, [10, 20, 30], 1.0)
    write_health(a2, 2, [10, 20], 3.0)
    write_health(b, 3, [10, 20, 30], 1.0)
    steps, blocks, matrix = health_matrix([read_health(a1), read_health(a2)], "rms")
    assert steps == [10, 20] and blocks == ["0", "1"]
    assert matrix == [[20.0, 40.0], [40.0, 80.0]]  # (1 + 3)/2 · (b + 1) · s
    steps, blocks, matrix = health_matrix([read_health(b)], "grad_norm")  # "other" is no block
    assert (steps, blocks, len(matrix[0])) == ([10, 20, 30], ["0", "1", "2"], 3)
    runs = load_runs(tmp_path)
    titles = [(title, linear) for title, linear, _ in health_rows(group_variants(runs, swept_axes(runs)))]
    assert titles == [
        ("block output RMS", False),
        ("attention entropy (nats)", True),
        ("largest attention logit", True),
        ("gradient norm", False),
        ("update/weight ratio", False),
    ]
    written = report(tmp_path)
    assert written["health"] == tmp_path / "health.png" and written["health"].stat().st_size > 0
    assert "](health.png)" in written["markdown"].read_text()


def test_a_sweep_without_health_records_draws_no_heatmap(tmp_path):
    job(tmp_path, ["optim.lr=1e-3"], [2.0])
    assert not [k for k in report(tmp_path) if k.startswith("health")]


def test_a_compiled_block_measures_its_attention_on_a_later_watched_step():
    """Compiled, first run unwatched: the watched step still records the attention figures, the eager ones."""
    model = build_model(to_model_config({**MODEL, "position": {"kind": "rope"}}))
    probe = Probe(model, roles(model))
    probe.watch()
    model(BATCH[:, :-1])
    eager = probe.gradients()["attn_entropy"]
    for block in model.blocks:
        block.compile(backend="eager")
    model(BATCH[:, :-1])
    assert probe.gradients()["attn_entropy"] == {}
    probe.watch()
    model(BATCH[:, :-1])
    assert probe.gradients()["attn_entropy"] == pytest.approx(eager, rel=1e-6)
