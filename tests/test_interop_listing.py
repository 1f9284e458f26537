"""What archlab-interop lists and what a refusal of a Hugging Face config says: every record names the
archlab parts its class maps to, docs/interop.md holds the listing as the command prints it, a family
archlab lacks is refused naming the part it needs, a fine-tune registered under a new ``model_type`` is
refused naming the family it reads as and loads as that family when asked, and archlab-interop says of
a checkpoint directory whether it loads."""

import json
from pathlib import Path

import pytest
from helpers.hf import HF_SIZES, NO_TOKENS, TOL, logits, max_diff, randomize

from archlab import ConfigError, compose_model
from archlab.cli.interop import main
from archlab.interop.families import FAMILIES, refusals
from archlab.interop.hf import config_from_hf, load_hf_dir
from archlab.interop.listing import listing

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")

DOCS = Path(__file__).resolve().parents[1] / "docs" / "interop.md"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random LLaMA saved by transformers, and the model itself."""
    config = transformers.LlamaConfig(
        **HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS
    )
    hf = randomize(transformers.LlamaForCausalLM(config), 3)
    path = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(path)
    return path, hf


def renamed(path: Path, tmp_path: Path, model_type: str) -> Path:
    """A copy of checkpoint ``path`` whose config.json says ``model_type``."""
    out = tmp_path / model_type
    out.mkdir()
    for file in path.iterdir():
        (out / file.name).write_bytes(file.read_bytes())
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return out


def test_every_family_names_its_class_and_parts():
    text = listing("text")
    for model_type, family in FAMILIES.items():
        assert family.parts, model_type
        assert f"{model_type} " in text and family.model_class in text and family.parts in text
    for model_type, refused in refusals().items():
        assert refused.missing in text and refused.model_class in text, model_type
    data = json.loads(listing("json"))
    assert [r["model_type"] for r in data["supported"]] == sorted(FAMILIES)


def test_docs_hold_the_listing_as_the_command_prints_it():
    assert listing("markdown") in DOCS.read_text(), "rerun archlab-interop format=markdown into docs/interop.md"


def test_a_family_archlab_lacks_is_refused_naming_the_part_it_needs():
    refused = refusals()["xlnet"]
    with pytest.raises(ConfigError, match="model_type='xlnet'") as e:
        config_from_hf(transformers.XLNetConfig())
    assert refused.missing in str(e.value) and refused.title in str(e.value)


def test_a_fine_tune_under_a_new_model_type_names_the_family_it_reads_as(llama_dir, tmp_path):
    path, hf = llama_dir
    own = renamed(path, tmp_path, "my_llama")
    with pytest.raises(ConfigError, match="model_type='my_llama'") as e:
        load_hf_dir(own)
    assert "reads as LLaMA (family='llama')" in str(e.value)
    model = load_hf_dir(own, family="llama")  # read as the family it resembles: the same logits
    assert max_diff(logits(model), logits(hf)) <= TOL


def test_archlab_interop_says_whether_a_checkpoint_loads(llama_dir, tmp_path, capsys):
    path, _ = llama_dir
    main([str(path)])
    assert "loads as LLaMA (LlamaForCausalLM)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit:
        main([str(renamed(path, tmp_path, "my_llama"))])
    assert exit.value.code == 1 and "does not load: model_type='my_llama'" in capsys.readouterr().out


def test_a_partial_rotary_refusal_names_the_field_that_was_set():
    """LLaMA rotates whole heads: a layout with rotary_fraction is refused naming rotary_fraction (not
    rotary_dim, which the user never set), and one with rotary_dim naming rotary_dim."""
    base = ["model=llama3.1-8b", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4"]
    by_fraction = compose_model([*base, "model.attention.n_kv_head=2", "model.position.rotary_fraction=0.5"])
    by_dim = compose_model([*base, "model.attention.n_kv_head=2", "model.position.rotary_dim=8"])
    fields = [[p.field for p in FAMILIES["llama"].problems(cfg)] for cfg in (by_fraction, by_dim)]
    assert "model.position.rotary_fraction" in fields[0] and "model.position.rotary_dim" not in fields[0]
    assert "model.position.rotary_dim" in fields[1]


def test_the_listing_opens_with_its_counts_in_every_format(capsys):
    """The summary line counts the records, the wrappers read as their language model, the refusals and the
    not-decoder-only classes: first in the text and markdown listings (so docs/interop.md keeps it current),
    as numbers in the json."""
    from archlab.interop.families.refused import NOT_DECODER, WRAPPED

    counts = (len(FAMILIES), len(WRAPPED), len(refusals()), len(NOT_DECODER))
    line = f"{counts[0]} families convert both ways, {counts[1]} vision-language classes load as their language "
    line += f"model, {counts[2]} are refused naming the part archlab lacks, {counts[3]} are not decoder-only "
    line += "language models"
    assert listing("text").splitlines()[0] == line
    assert listing("markdown").startswith(line + ".\n\n| `model_type` |")
    summary = json.loads(listing("json"))["summary"]
    got = (summary["converted"], summary["language_model_of"], summary["refused"], summary["not_decoder_only"])
    assert got == counts
    main([])
    assert capsys.readouterr().out.splitlines()[0] == line
