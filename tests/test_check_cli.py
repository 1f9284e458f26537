"""archlab-check: the entry point as users run it (a subprocess: the preset table and a config
error), and its reports in-process on configs composed exactly as the command line composes them."""

import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from archlab import ConfigError
from archlab.build import compose
from archlab.cli.check import REFERENCE_COUNTS, model_overridden, preset_rows, presets, print_table, run

PUBLISHED_GPT2 = 124_439_808


def check(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "archlab.cli.check", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def check_in_process(capsys, *overrides):
    """``run`` on the config Hydra composes for ``overrides``: (exit status, stdout)."""
    code = run(compose("check", overrides), list(overrides))
    return code, capsys.readouterr().out


def test_preset_table_json_all_ok(tmp_path):
    result = check("format=json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == len(presets())
    by_name = {row["preset"]: row for row in rows}
    assert by_name["gpt2"]["reference"] == PUBLISHED_GPT2
    assert by_name["llama3-70b"]["reference"] == 70_553_706_496
    nano = by_name.pop("nano")  # not a published model: its own counts agree, with nothing to compare to
    assert nano["reference"] is None and nano["status"] == "no reference"
    assert nano["analytic"]["total"] == nano["built"]["total"] == 858_880
    for row in by_name.values():
        assert row["analytic"]["total"] == row["built"]["total"] == row["reference"], row["preset"]
        assert row["status"] == "OK"
    assert list(tmp_path.iterdir()) == []  # no Hydra outputs/ or log files in the working directory


def test_config_error_is_one_line_and_exit_2():
    result = check("model=nano", "model.attention.n_head=5")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "model.attention.n_head=5" in result.stderr
    full = check("model=nano", "model.attention.n_head=5", env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "ConfigError" in full.stderr


def test_which_overrides_select_one_model():
    assert not model_overridden([]) and not model_overridden(["format=json"])
    assert model_overridden(["model=gpt2"])
    assert model_overridden(["model/position=rope"])
    assert model_overridden(["model.n_layer=2"])


def test_preset_table_text(capsys):
    code, out = check_in_process(capsys)
    assert code == 0
    assert "MISMATCH" not in out
    ok_lines = [line for line in out.splitlines() if line.strip().endswith("OK")]
    assert len(ok_lines) == len(REFERENCE_COUNTS)
    assert any("gptj-6b" in line and line.count("6,050,882,784") == 3 for line in ok_lines)
    assert [line.split()[0] for line in out.splitlines() if line.strip().endswith("no reference")] == ["nano"]


def test_one_model_changed_part_json(capsys):
    code, out = check_in_process(capsys, "model=gpt2", "model/position=rope", "format=json")
    assert code == 0
    result = json.loads(out)
    # Rope drops GPT-2's 1024 x 768 position table and nothing else.
    total = PUBLISHED_GPT2 - 1024 * 768
    assert result["analytic"]["total"] == result["built"]["total"] == total
    assert result["analytic"]["position_embedding"] == result["built"]["position_embedding"] == 0
    # 6N + 12·L·H·Q·T (PaLM appendix B); with a tied head and no table, N = total.
    assert result["flops_per_token"] == 6 * total + 12 * 12 * 12 * 64 * 1024


def test_one_model_names_the_settings_its_variant_ignores(capsys):
    code, out = check_in_process(capsys, "model/mlp=swiglu", "model.mlp.routing.aux_loss_weight=0.01", "format=json")
    line = "model.mlp.routing.aux_loss_weight=0.01 is left out: MLP swiglu has no such field"
    preset = "model.mlp.approximate='tanh' is left out: MLP swiglu has no such field"  # GPT-2's GELU's
    assert code == 0 and json.loads(out)["ignored"] == [preset, line]
    code, out = check_in_process(capsys, "model/mlp=moe", "model.mlp.routing.aux_loss_weight=0.01")
    assert code == 0 and "ignored" not in out
    code, out = check_in_process(capsys, "model/mlp=swiglu", "model.mlp.routing.aux_loss_weight=0.01")
    assert code == 0 and line in out.splitlines()


def test_one_model_json_holds_the_model_as_built(capsys):
    """``model`` is the config the model is built from: each section with its chosen option's fields alone
    (a Llama preset's RoPE base and pairing left out under ALiBi, and said so), not the composed node."""
    code, out = check_in_process(capsys, "model=llama3-8b", "model.n_layer=1", "model/position=alibi", "format=json")
    result = json.loads(out)
    assert code == 0 and result["model"]["position"] == {"kind": "alibi", "alibi_scale": 1.0, "alibi_rounding": "none"}
    assert "model.position.theta=500000.0 is left out: position alibi has no such field" in result["ignored"]
    assert "???" not in out and result["model"]["attention"]["n_kv_head"] == 8


def test_one_model_breakdown_text(capsys):
    code, out = check_in_process(capsys, "model=llama2-70b", "model.n_layer=2")
    assert code == 0
    for component in ("token_embedding", "attention", "mlp", "norms", "final_norm", "head", "total"):
        assert component in out
    # two LLaMA-2 70B blocks of attention: 2·(2d·H·hd + 2d·KV·hd), d 8192, H 64, KV 8, hd 128
    d = 8192
    assert f"{2 * (2 * d * 64 * 128 + 2 * d * 8 * 128):,}" in out
    assert "FLOPs per token" in out and "MISMATCH" not in out


def test_unpublished_preset_has_no_reference():
    """nano is no published model: archlab-check's own references give it none (it once held nano's
    closed form there, and printed OK against itself), while gpt2 is still held to its published count."""
    rows = preset_rows(["gpt2", "nano"])
    assert [(row["reference"], row["status"]) for row in rows] == [(PUBLISHED_GPT2, "OK"), (None, "no reference")]
    console = Console(width=120, highlight=False, record=True)
    print_table(rows, console)
    lines = {line.split()[0]: line.split() for line in console.export_text().splitlines() if line.strip()}
    assert lines["gpt2"] == ["gpt2", *[f"{PUBLISHED_GPT2:,}"] * 3, "=", "total", "OK"]
    assert lines["nano"] == ["nano", "858,880", "858,880", "-", "=", "total", "no", "reference"]


def test_wrong_reference_is_a_mismatch():
    rows = preset_rows(["gpt2", "nano"], references={"gpt2": PUBLISHED_GPT2 + 1})
    assert [row["status"] for row in rows] == ["MISMATCH", "no reference"]
    assert preset_rows(["gpt2"], references={"gpt2": PUBLISHED_GPT2})[0]["status"] == "OK"


def test_bad_format_is_refused():
    with pytest.raises(ConfigError, match="format='xml' is invalid: allowed table or json"):
        run(compose("check", ["format=xml"]), ["format=xml"])


@pytest.mark.parametrize(
    "preset, model_class",
    [("llama2-7b", "LlamaForCausalLM"), ("gpt2", "GPT2LMHeadModel"), ("mixtral-8x7b", "MixtralForCausalLM")],
)
def test_one_model_says_which_hugging_face_class_it_exports_to(capsys, preset, model_class):
    """The class, and the other families that hold the layout (``archlab-export family=``): each one's
    transformers config class takes the layout's config."""
    from archlab import compose_model
    from archlab.interop.families import FAMILIES
    from archlab.interop.hf import config_to_hf

    code, out = check_in_process(capsys, f"model={preset}")
    _, json_out = check_in_process(capsys, f"model={preset}", "format=json")
    export = json.loads(json_out)["hf_export"]
    also = export.pop("also_held_by")
    assert export == {"exports_to": model_class, "nearest": None, "blocking": [], "transformers_installed": True}
    line = f"exports to: {model_class} (Hugging Face, with archlab-export)"
    assert code == 0 and (line + (f"; also held by family={', '.join(also)}" if also else "")) in out.splitlines()
    assert FAMILIES[also[0]].model_class != model_class  # llama: mistral, ..., gpt2: opt, ..., mixtral: ...
    for family in also:
        assert type(config_to_hf(compose_model([f"model={preset}"]), family)).__name__ == FAMILIES[family].config_class


def test_a_layout_that_cannot_export_lists_every_blocking_field_and_the_nearest_class(capsys):
    """A LLaMA with ALiBi and dropout: both fields at once, and setting them as the line says exports it
    (transformers' own config class is the independent judge)."""
    transformers = pytest.importorskip("transformers")
    from archlab import compose_model
    from archlab.interop.hf import config_to_hf

    layout = ["model=llama2-7b", "model.n_layer=2", "model/position=alibi", "model.dropout=0.1"]
    code, out = check_in_process(capsys, *layout)
    line = (
        "not exportable to Hugging Face; nearest: LlamaForCausalLM, which needs model.position.kind=rope "
        "(is alibi), model.dropout=0.0 (is 0.1)"
    )
    assert code == 0 and line in out.splitlines()
    _, out = check_in_process(capsys, *layout, "format=json")
    export = json.loads(out)["hf_export"]
    assert export["exports_to"] is None and export["nearest"] == "LlamaForCausalLM"
    assert [(b["field"], b["value"], b["allowed"]) for b in export["blocking"]] == [
        ("model.position.kind", "alibi", "rope"),
        ("model.dropout", 0.1, "0.0"),
    ]
    fixed = [*layout, "model/position=rope", "model.dropout=0.0"]
    assert isinstance(config_to_hf(compose_model(fixed)), transformers.LlamaConfig)
    _, out = check_in_process(capsys, *fixed)
    assert any(
        x.startswith("exports to: LlamaForCausalLM (Hugging Face, with archlab-export)") for x in out.splitlines()
    )


@pytest.mark.parametrize(
    "layout, model_class, fix",
    [  # issue 43's study: LLaMA's parts with Gated DeltaNet 3:1 are Qwen3.5's after three fields, not LLaMA's
        (  # after dropping the pattern
            ["model=llama2-7b", "model/layers=deltanet_3_1"],
            "Qwen3_5ForCausalLM",
            ["model.norm.unit_offset=true", "model.attention.qk_norm=head", "model.attention.gate=elementwise"],
        ),
        (  # 3:1 local/global on the default model: SmolLM3's norm and MLP, not GPT-NeoX without the pattern
            ["+layers_variant=local_global_rope"],
            "SmolLM3ForCausalLM",
            ["model.norm.kind=rmsnorm", "model.mlp.kind=swiglu"],
        ),
        (  # MoE every other layer: Granite-MoE-SWA names its sinks first and, once they are set, its experts
            ["model=llama2-7b", "model/layers=moe_every_other"],
            "GraniteMoeSWAForCausalLM",
            ["model.mlp.kind=moe", "model.attention.sinks=true"],
        ),
    ],
)
def test_the_nearest_class_keeps_the_layers_and_following_it_exports(capsys, layout, model_class, fix):
    """A class that holds the layout's per-layer parts ranks before one that needs them dropped, though it
    needs more fields; every field it needs is listed at once, and set as the line says, the layout
    exports to that class with its layer kinds."""
    layout = [*layout, "model.n_layer=4"]
    _, out = check_in_process(capsys, *layout, "format=json")
    before = json.loads(out)
    export = before["hf_export"]
    assert export["nearest"] == model_class
    assert sorted(f"{b['field']}={b['allowed'].split(' or ')[0]}" for b in export["blocking"]) == sorted(fix)
    _, out = check_in_process(capsys, *layout, *fix, "format=json")
    after = json.loads(out)
    assert after["hf_export"]["exports_to"] == model_class
    assert [k["layers"] for k in after["layer_kinds"].values()] == [k["layers"] for k in before["layer_kinds"].values()]


def test_without_transformers_the_export_line_says_so(capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else find_spec(name, *a)
    )
    _, out = check_in_process(capsys, "model=gpt2")
    note = '; transformers is not installed (pip install -e ".[hf]"), which the export needs'
    line = next(
        x for x in out.splitlines() if x.startswith("exports to: GPT2LMHeadModel (Hugging Face, with archlab-export)")
    )
    assert line.endswith(note)


HYBRID = ["+mixer_variant=hybrid_1_4", "model.n_layer=4"]  # Gated DeltaNet 3:1 with attention (study_mixers)


def test_check_previews_match_sizing_a_hybrid_against_its_plain_model(capsys):
    """``match.reference={layers: {pattern: []}}``: the hybrid's d_ff sized so its total equals the same
    model with every layer attention. The value is the closest d_ff by the closed-form counts of both
    models composed apart, and the rest of the report is of the sized model."""
    from dataclasses import replace

    from archlab import compose_model
    from archlab.accounting import count

    match = ["match.reference={layers: {pattern: []}}"]
    code, out = check_in_process(capsys, *HYBRID, *match, "format=json")
    result = json.loads(out)
    assert code == 0 and result["match"]["field"] == "mlp.d_ff"
    d_ff = result["match"]["value"]
    target = count(compose_model([*HYBRID, "model.layers.pattern=[]"]))["total"]
    hybrid = compose_model(HYBRID)
    totals = {k: count(replace(hybrid, mlp=replace(hybrid.mlp, d_ff=k)))["total"] for k in (d_ff - 1, d_ff, d_ff + 1)}
    assert result["match"]["target"] == target and result["analytic"]["total"] == totals[d_ff]
    assert abs(totals[d_ff] - target) == min(abs(t - target) for t in totals.values()) <= 0.005 * target
    assert len(result["layer_kinds"]) == 2 and result["model"]["mlp"]["d_ff"] == d_ff
    _, out = check_in_process(capsys, *HYBRID, *match)
    assert (
        f"match (total, reference {{layers: []}}): model.mlp.d_ff={d_ff} gives {totals[d_ff]:,} against the "
        f"reference's {target:,}"
    ).replace("{layers: []}", "{layers: {pattern: []}}") in out


def test_check_previews_match_of_training_flops_as_a_factor_on_the_steps(capsys):
    """``training_flops`` sizes no model field: the factor on the reference's steps, its FLOPs per token
    over the hybrid's."""
    from dataclasses import replace

    from archlab import compose_model
    from archlab.accounting import count

    overrides = [*HYBRID, "match.reference={layers: {pattern: []}}", "match.quantity=training_flops", "format=json"]
    _, out = check_in_process(capsys, *overrides)
    hybrid = compose_model(HYBRID)
    plain = count(replace(hybrid, layers=replace(hybrid.layers, pattern=[])))
    hybrid = count(hybrid)
    factor = json.loads(out)["match"]["steps_factor"]
    assert factor == pytest.approx(plain["flops_per_token"] / hybrid["flops_per_token"], rel=1e-12)
