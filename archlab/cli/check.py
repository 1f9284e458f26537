"""archlab-check: every preset's analytic and built (meta device) parameter counts against the
published ones, or, given any ``model`` override, one composed model's breakdown and FLOPs per token.

    archlab-check                                      # the preset table; exit 1 on any mismatch
    archlab-check model=llama3-70b                     # one model, per component
    archlab-check model=gpt2 model/position=rope format=json
    archlab-check model/mlp=swiglu 'match.reference={mlp: {kind: gelu}}'   # what archlab-train's match sets

For one model it also gives each layer kind's layers, parts and counts (model.layers), says which
Hugging Face class the layout exports to (archlab-export), or every
field that blocks an export and the nearest class that would hold it, and every field set that the
chosen variant ignores. With ``match.*`` (archlab-train's) it prints what match sets and reports the sized model.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any, Optional, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich import box
from rich.console import Console
from rich.table import Table

from archlab.accounting import COMPONENTS, built_counts, count
from archlab.build import CONF_DIR, build_model, compose
from archlab.cli.errors import short_config_errors
from archlab.cli.settings import run_hydra_command
from archlab.config import model_config_dict, to_model_config, with_fields
from archlab.config.commands import CheckConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.loop import describe_loop
from archlab.config.shared import describe_shared
from archlab.config.store import register_configs
from archlab.errors import ConfigError
from archlab.interop.families.base import bare
from archlab.interop.hf import exportability, holding_families
from archlab.nn.ngram_input import NGramInput
from archlab.nn.validation import entries, validate

# Total parameters of each published layout: Hugging Face transformers' own model (5.23) of the published
# config.json (the Hub repo named per line), built on the meta device, tied tensors counted once. Where the
# authors give an exact figure it agrees: the Pythia model card's table, and the non-embedding counts of
# the Gemma and Gemma 2 papers (table 2). A preset without a published model (nano) has no entry: its row
# says "no reference", and only its analytic and built counts are compared.
REFERENCE_COUNTS = {
    "gpt2": 124_439_808,  # openai-community/gpt2, and gpt2-medium, -large, -xl
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gptj-6b": 6_050_882_784,  # EleutherAI/gpt-j-6b
    "llama-7b": 6_738_415_616,  # LLaMA 1 as converted for transformers (huggyllama/llama-7b, -13b, -65b)
    "llama-13b": 13_015_864_320,
    "llama-65b": 65_285_660_672,
    "llama2-7b": 6_738_415_616,  # meta-llama/Llama-2-7b-hf
    "llama2-70b": 68_976_648_192,  # meta-llama/Llama-2-70b-hf
    "llama3-8b": 8_030_261_248,  # meta-llama/Meta-Llama-3-8B
    "llama3-70b": 70_553_706_496,  # meta-llama/Meta-Llama-3-70B
    "pythia-160m": 162_322_944,  # EleutherAI/pythia-160m
    "pythia-1.4b": 1_414_647_808,  # EleutherAI/pythia-1.4b
    "mistral-7b": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "qwen2-0.5b": 494_032_768,  # Qwen/Qwen2-0.5B
    "qwen2.5-7b": 7_615_616_512,  # Qwen/Qwen2.5-7B
    "qwen3-0.6b": 596_049_920,  # Qwen/Qwen3-0.6B
    "qwen3-8b": 8_190_735_360,  # Qwen/Qwen3-8B
    "phi-1.5": 1_418_270_720,  # microsoft/phi-1_5
    "phi-2": 2_779_683_840,  # microsoft/phi-2
    "gemma-2b": 2_506_172_416,  # google/gemma-2b
    "gemma-7b": 8_537_680_896,  # google/gemma-7b
    "gemma2-2b": 2_614_341_888,  # google/gemma-2-2b
    "gemma2-9b": 9_241_705_984,  # google/gemma-2-9b
    "olmo2-7b": 7_298_617_344,  # allenai/OLMo-2-1124-7B
    "llama3.1-8b": 8_030_261_248,  # meta-llama/Llama-3.1-8B
    "mixtral-8x7b": 46_702_792_704,  # mistralai/Mixtral-8x7B-v0.1
    "qwen3-30b-a3b": 30_532_122_624,  # Qwen/Qwen3-30B-A3B
    "deepseek-v2-lite": 15_706_484_224,  # deepseek-ai/DeepSeek-V2-Lite
    "deepseek-v3": 671_026_404_352,  # deepseek-ai/DeepSeek-V3 (the main model, without its MTP module)
    # Layers that differ (model.layers), transformers 5.24 modules of the published configs:
    "gemma3-1b": 999_885_952,  # google/gemma-3-1b-pt (Gemma3ForCausalLM)
    "gemma3-27b": 27_009_346_304,  # google/gemma-3-27b-pt's text_config: the text stack, no vision tower
    "smollm3-3b": 3_075_098_624,  # SmolLM3Config() defaults (HuggingFaceTB/SmolLM3-3B)
    "step-3.5-flash": 196_956_118_272,  # stepfun-ai/Step-3.5-Flash: Step3p7TextModel + LM head, no MTP layers
    "gpt-oss-20b": 20_914_757_184,  # openai/gpt-oss-20b (GptOssForCausalLM)
    "gpt-oss-120b": 116_829_156_672,  # openai/gpt-oss-120b
    "mamba-codestral-7b": 7_285_403_648,  # Mamba2Config() defaults (Mamba-Codestral-7B-v0.1): Mamba2ForCausalLM
    "llama4-scout-17b-16e": 107_769_861_120,  # Llama4TextConfig() defaults: the text stack, no vision tower
    "qwen3-next-80b-a3b": 79_674_391_296,  # Qwen/Qwen3-Next-80B-A3B-Instruct: Qwen3NextForCausalLM, no MTP layer
    "bamba-9b": 9_992_765_440,  # BambaConfig() defaults: BambaForCausalLM, every layer Mamba-2
    "recurrentgemma-2b": 2_682_862_080,  # google-deepmind/recurrentgemma RECURRENT_GEMMA_2B_V1 (not the HF defaults)
    "jamba-v0.1": 51_570_323_328,  # JambaConfig() defaults (ai21labs/Jamba-v0.1): JambaForCausalLM; card: 52B
    "xlstm-7b": 6_865_424_896,  # xLSTMConfig() defaults (NX-AI/xLSTM-7b): xLSTMForCausalLM
    "kimi-linear-48b-a3b": 49_133_074_464,  # KimiLinearConfig() defaults: KimiLinearForCausalLM ("48B": see reference.md)
    "deepseek-v3.2-exp": 671_877_929_216,  # DeepseekV32Config() defaults: DeepseekV32ForCausalLM, no MTP module
    "lfm3-1.7b": 1_728_801_536,  # Lfm3Config() defaults (LiquidAI/LFM3-1.7B): Lfm3ForCausalLM
    "ling-3.0-flash": 124_414_191_072,  # BailingHybridConfig() defaults (inclusionAI/Ling-3.0-Flash), no MTP layer
}

# Active parameters per token of the mixture-of-experts presets, from the same meta-built models: every
# parameter but the (experts - top_k) routed experts a token skips in each MoE layer, the input embedding
# in full. The published figures round these (Mixtral 12.9B; Qwen3 3.3B); DeepSeek's leave the input
# embedding out (V2-Lite 2.4B; V3 36.6B = 37,552,282,624 - 129,280 x 7,168).
ACTIVE_COUNTS = {
    "mixtral-8x7b": 12_879_925_248,
    "qwen3-30b-a3b": 3_353_032_704,
    "deepseek-v2-lite": 2_661_150_208,
    "deepseek-v3": 37_552_282_624,
    "step-3.5-flash": 11_987_311_872,  # card: "activates only 11B of its 196B"
    "gpt-oss-20b": 4_187_440_704,  # card: 3.6B active, without the input embedding (201,088 x 2,880)
    "gpt-oss-120b": 5_711_982_912,  # card: 5.1B active, likewise
    "llama4-scout-17b-16e": 17_172_894_720,  # card: 17B active
    "qwen3-next-80b-a3b": 3_874_929_408,  # card: 80B total, 3B active
    "jamba-v0.1": 12_110_311_296,  # card: 12B active
    "kimi-linear-48b-a3b": 3_494_852_640,  # name: A3B; 3,117,365,280 without the input embedding
    "deepseek-v3.2-exp": 38_403_807_488,  # V3's 37B plus the indexers; 37,477,128,448 without the input embedding
    "ling-3.0-flash": 5_505_672_672,  # BailingHybridConfig() defaults; 5,103,281,632 without the input embedding
}

register_configs()


def presets() -> list[str]:
    """Names of the presets shipped in ``conf/model/``: the published ones first, in REFERENCE_COUNTS' order."""
    order = list(REFERENCE_COUNTS)
    names = (p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def report(cfg: Any) -> dict[str, Any]:
    """Analytic counts (from the config alone), built counts (meta device) and FLOPs per token."""
    cfg = validate(to_model_config(cfg))
    analytic = count(cfg)
    flops = analytic.pop("flops_per_token")
    built = built_counts(build_model(cfg, device="meta", check=False))
    return {"analytic": analytic, "built": built, "flops_per_token": flops}


def status(row: dict[str, Any]) -> str:
    """OK when analytic == built == reference (and the active count == its reference, where there is
    one); ``no reference`` for an unpublished preset whose counts agree; MISMATCH otherwise."""
    total = row["analytic"]["total"]
    if total != row["built"]["total"] or (row["reference"] is not None and total != row["reference"]):
        return "MISMATCH"
    if row.get("active_reference") is not None and row["analytic"]["active"] != row["active_reference"]:
        return "MISMATCH"
    return "OK" if row["reference"] is not None else "no reference"


def preset_rows(
    names: Optional[list[str]] = None,
    references: dict[str, int] = REFERENCE_COUNTS,
    active_references: dict[str, int] = ACTIVE_COUNTS,
) -> list[dict]:
    """One report per preset (composed exactly as ``model=<name>``), with its references and status."""
    rows = []
    for name in names or presets():
        row = {
            "preset": name,
            "reference": references.get(name),
            "active_reference": active_references.get(name),
            **report(compose("check", [f"model={name}"]).model),
        }
        row["status"] = status(row)
        rows.append(row)
    return rows


def model_overridden(overrides: list[str]) -> bool:
    """Do the overrides touch the model at all (``model=``, ``model/<family>=``, ``model.<field>=``)?"""
    keys = (o.lstrip("+~").split("=")[0] for o in overrides)
    return any(k.replace("/", ".").split(".")[0] == "model" for k in keys)


def _layout(cfg: Any) -> str:
    """The composed choices and sizes on one line, each family's part as its chosen entry describes it."""
    m = to_model_config(cfg)
    e = entries(m)
    return (
        f"V={m.vocab_size} ctx={m.context_length} L={m.n_layer} d={m.d_model}"
        f"{'' if m.embedding_dim is None else f' embedding_dim={m.embedding_dim}'}  norm={e.norm.describe(m)} "
        f"block={e.block.describe(m)} position={e.position.describe(m)} attention={e.attention.describe(m)} "
        f"mlp={e.mlp.describe(m)} head={e.head.describe(m)}"
        f"{f' stream={e.stream.describe(m)}' if e.stream.multiple else ''}"
        f"{f' loop={describe_loop(m)}' if describe_loop(m) else ''}"
        f"{f' shared={describe_shared(m)}' if describe_shared(m) else ''}"
        f"{f' per_layer_input={m.per_layer_input.dim}' if m.per_layer_input.dim else ''}"
        f"{f' {NGramInput.describe(m)}' if m.ngram_input.layers else ''}"
    )


def layer_kinds(cfg: Any) -> dict[str, dict[str, Any]]:
    """Per layer kind of ``model.layers`` (and ``(model)`` for the layers given none): its layers, its
    parts as their entries describe them, and one layer's attention, MLP and block-norm parameters."""
    m = validate(to_model_config(cfg))
    out: dict[str, dict[str, Any]] = {}
    for i, c in enumerate(layer_configs(m)):
        name = layer_kind(m, i) or "(model)"
        if name not in out:
            e = entries(c)
            out[name] = {
                "layers": [],
                "parts": f"position={e.position.describe(c)} attention={e.attention.describe(c)} mlp={e.mlp.describe(c)}"
                + (f" stream={e.stream.describe(c)}" if e.stream.multiple else ""),
                "attention": e.attention.num_params(c, i),
                "mlp": e.mlp.num_params(c, i),
                "norms": e.block.num_params(c, i),
            }
        out[name]["layers"].append(i)
    return out


def export_report(cfg: Any) -> dict[str, Any]:
    """The Hugging Face class the layout exports to and the other families (``model_type``) that hold it
    exactly, which ``archlab-export family=`` picks; or (``exports_to`` null) the nearest class and every
    field that blocks it, each with its value and what that class allows; and whether transformers,
    which the export itself needs, is installed."""
    family, problems = exportability(cfg)
    return {
        "exports_to": None if problems else family.model_class,
        "also_held_by": [] if problems else [f.model_type for f in holding_families(cfg) if f is not family],
        "nearest": family.model_class if problems else None,
        "blocking": [{"field": p.field, "value": p.value, "allowed": p.wants} for p in problems],
        "transformers_installed": importlib.util.find_spec("transformers") is not None,
    }


def export_line(export: dict[str, Any]) -> str:
    """``export_report`` on one line: ``exports to: LlamaForCausalLM``, or ``not exportable ...; nearest:
    ..., which needs <field>=<allowed> (is <value>), ...``."""
    if export["exports_to"] is not None:
        line = f"exports to: {export['exports_to']} (Hugging Face, with archlab-export)"
        if export["also_held_by"]:
            line += f"; also held by family={', '.join(export['also_held_by'])}"
    else:
        needs = ", ".join(f"{b['field']}={b['allowed']} (is {bare(b['value'])})" for b in export["blocking"])
        line = f"not exportable to Hugging Face; nearest: {export['nearest']}, which needs {needs}"
    if not export["transformers_installed"]:
        line += '; transformers is not installed (pip install -e ".[hf]"), which the export needs'
    return line


def print_table(rows: list[dict], console: Console) -> None:
    table = Table("preset", "analytic", "built (meta)", "reference", "active", "status", box=box.SIMPLE_HEAD)
    for row in rows:
        ref = f"{row['reference']:,}" if row["reference"] is not None else "-"
        active = row["analytic"]["active"]
        shown = f"{active:,}" if active != row["analytic"]["total"] else "= total"
        table.add_row(
            row["preset"], f"{row['analytic']['total']:,}", f"{row['built']['total']:,}", ref, shown, row["status"]
        )
    console.print(table)
    console.print(
        "reference: published totals (Hugging Face transformers models built on the meta device), listed in "
        "archlab/cli/check.py; - and no reference: not a published model; active: parameters one token goes through "
        "(a mixture of experts: only its top-k routed experts), checked against the published models' too"
    )


def print_breakdown(title: str, result: dict, layout: str, console: Console) -> bool:
    """Print one model's per-component counts; return whether analytic and built agree everywhere."""
    analytic, built = result["analytic"], result["built"]
    console.print(title or "model (composed defaults)", soft_wrap=True, markup=False)  # [a,b] is no markup
    console.print(layout, soft_wrap=True, markup=False)
    if len(result["layer_kinds"]) > 1 or "(model)" not in result["layer_kinds"]:
        for name, kind in result["layer_kinds"].items():
            console.print(
                f"layer kind {name}, layers {','.join(map(str, kind['layers']))}: {kind['parts']}; per layer "
                f"attention {kind['attention']:,}, mlp {kind['mlp']:,}, norms {kind['norms']:,}",
                soft_wrap=True,
                markup=False,
            )
    console.print(export_line(result["hf_export"]), soft_wrap=True, markup=False)
    if result["match"] is not None:
        console.print(match_line(result["match"], result["model"]), soft_wrap=True, markup=False)
    for line in result["ignored"]:
        console.print(line, soft_wrap=True, markup=False)
    table = Table("component", "analytic", "built (meta)", "", box=box.SIMPLE_HEAD)
    for c in (*COMPONENTS, "total"):
        table.add_row(c, f"{analytic[c]:,}", f"{built[c]:,}", "OK" if analytic[c] == built[c] else "MISMATCH")
    console.print(table)
    if analytic["mtp"]:
        console.print(f"at inference (without the multi-token prediction modules): {analytic['inference']:,}")
    console.print(f"non-embedding parameters: {analytic['non_embedding']:,}")
    if analytic["active"] != analytic["inference"]:
        console.print(
            f"active parameters per token: {analytic['active']:,} "
            f"({analytic['active'] - analytic['token_embedding']:,} without the input embedding)"
        )
    console.print(f"per block (the last): {analytic['per_block']:,}")
    console.print(
        "training FLOPs per token (6N, N the active non-embedding parameters, + the attention scores and "
        "weighted sums, and any multi-token prediction modules, forward and backward, at T = context_length): "
        f"{result['flops_per_token']:,}"
    )
    return all(analytic[c] == built[c] for c in (*COMPONENTS, "total"))


def preview_match(cfg: DictConfig) -> Optional[dict[str, Any]]:
    """What ``match.*`` sets in archlab-train (``training.sweep.apply_match``), set in ``cfg.model`` so the
    report is of the sized model; None without ``match.reference`` or where the variant lacks
    ``match.field``. ``training_flops`` sets no model field: the factor on the reference's steps instead."""
    from archlab.training.sweep import apply_match

    m = cfg.match
    if m.quantity != "training_flops" or m.reference is None:
        return apply_match(cfg)
    model = validate(to_model_config(cfg.model))
    reference = validate(with_fields(model, cast(dict, OmegaConf.to_container(m.reference)), "match.reference"))
    ours, theirs = count(model)["flops_per_token"], count(reference)["flops_per_token"]
    return {"reference": OmegaConf.to_container(m.reference), "quantity": m.quantity, "steps_factor": theirs / ours}


def match_line(record: dict[str, Any], model: dict[str, Any]) -> str:
    """``preview_match``'s record on one line, with the sizes it counted at (archlab-train's data sets them)."""
    reference = json.dumps(record["reference"]).replace('"', "")
    if record["quantity"] == "training_flops":
        return (
            f"match (training_flops, reference {reference}): trainer.max_steps = {record['steps_factor']:.4f} x "
            "the reference's steps (its training FLOPs per token over this model's)"
        )
    return (
        f"match ({record['quantity']}, reference {reference}): model.{record['field']}={record['value']} gives "
        f"{record['params']:,} against the reference's {record['target']:,} ({record['relative_difference']:+.2%}), "
        f"at model.vocab_size={model['vocab_size']} and context_length={model['context_length']} "
        "(archlab-train matches at its data's)"
    )


def run(cfg: DictConfig, overrides: list[str]) -> int:
    """Print the report for the composed ``cfg`` and its command-line ``overrides``; return the
    exit status: 0 when every count agrees, 1 on any mismatch."""
    if cfg.format not in ("table", "json"):
        raise ConfigError("format", cfg.format, "table or json")
    console = Console(width=max(Console().width, 110), highlight=False)
    if not model_overridden(overrides) and cfg.match.reference is None:
        rows = preset_rows()
        if cfg.format == "json":
            print(json.dumps(rows, indent=2))
        else:
            print_table(rows, console)
        return int(any(row["status"] == "MISMATCH" for row in rows))
    from archlab.training.sweep import ignored_settings

    matched = preview_match(cfg)
    model = validate(to_model_config(cfg.model))
    ignored_fields = ignored_settings(cfg, model)
    result = {**report(cfg.model), "layer_kinds": layer_kinds(cfg.model), "hf_export": export_report(cfg.model)}
    result["match"] = matched
    # the model as built: each section with its chosen option's fields alone (--cfg job prints what Hydra
    # composed: every option's fields, ??? where unset)
    result["model"] = model_config_dict(model)
    result["ignored"] = ignored_fields
    if cfg.format == "json":
        print(json.dumps(result, indent=2))
        return int(result["analytic"]["total"] != result["built"]["total"])
    title = " ".join(o for o in overrides if not o.startswith("format="))
    return int(not print_breakdown(title, result, _layout(cfg.model), console))


@hydra.main(version_base="1.3", config_path="pkg://archlab.conf", config_name="check")
@short_config_errors
def check_app(cfg: DictConfig) -> None:
    code = run(cfg, list(HydraConfig.get().overrides.task))
    if code:
        sys.exit(code)


def main() -> None:
    """The console script: ``--help`` lists this command's settings and model groups; the rest is Hydra's."""
    run_hydra_command("archlab-check", __doc__, "check", CheckConfig, check_app)


if __name__ == "__main__":
    main()
