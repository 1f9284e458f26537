"""archlab-export: a safetensors file, a run directory and a checkpoint become Hugging Face directories that
transformers' own AutoModelForCausalLM and AutoTokenizer load, giving archlab's logits (every weight
randomised) and archlab's token ids and text for the char, byte and bpe tokenizers; bad input is one
error line before anything is written."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
from helpers.hf import randomize
from helpers.training import compose_train

from archlab import build_model, compose_model
from archlab.cli.export import main
from archlab.interop.export import run_eos
from archlab.run_files import SHARDED_METADATA
from archlab.tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer
from archlab.weights import TOKENIZER_KEY, load_weights, save_weights

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
# text beyond the fitted vocabulary for byte and bpe: other scripts, emoji, runs of spaces and tabs
UNSEEN = ["héllo wörld — ☃ 😀", "  two  spaces\tand\ttabs\n\n", "", "日本語のテキスト"]
TINY = ["model.context_length=32", "model.n_layer=2", "model.d_model=32", "model.attention.n_head=4"]
LAYOUTS = {  # tokenizer kind -> (layout, the class it exports to)
    "char": (["model=llama2-7b", *TINY, "model.attention.n_kv_head=2", "model.mlp.d_ff=48"], "LlamaForCausalLM"),
    "byte": (["model=gpt2", *TINY], "GPT2LMHeadModel"),
    "bpe": (["model=qwen3-8b", *TINY, "model.attention.n_kv_head=2", "model.mlp.d_ff=48"], "Qwen3ForCausalLM"),
}
TOKENIZERS = {
    "char": lambda: CharTokenizer.fit(TEXT),
    "byte": ByteTokenizer,
    "bpe": lambda: BPETokenizer.fit(TEXT, 300),
}


def saved(path, overrides, tokenizer, seed=0):
    """A random model of ``overrides`` saved as training saves its export: the tokenizer in the metadata."""
    model = randomize(build_model(compose_model([*overrides, f"model.vocab_size={tokenizer.vocab_size}"])), seed)
    save_weights(model, path, metadata={TOKENIZER_KEY: json.dumps(tokenizer.to_dict())})
    return model


def logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_exported_model_and_tokenizer_match_archlab(kind, tmp_path, capsys):
    tokenizer = TOKENIZERS[kind]()
    overrides, model_class = LAYOUTS[kind]
    model = saved(tmp_path / "model.safetensors", overrides, tokenizer)
    main([str(tmp_path / "model.safetensors"), f"out={tmp_path / 'hf'}"])
    assert f"wrote {model_class} and its {kind} tokenizer" in capsys.readouterr().out

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == model_class and hf_tok.model_max_length == 32
    ids = tokenizer.encode(TEXT[:32])
    assert (logits(hf, ids) - logits(model.eval(), ids)).abs().max().item() < 1e-4

    texts = [TEXT, TEXT[5:40], TEXT.upper() if kind != "char" else TEXT[::-1]] + (UNSEEN if kind != "char" else [])
    for text in texts:
        got = hf_tok(text)["input_ids"]
        assert got == tokenizer.encode(text), text
        assert hf_tok.decode(got) == tokenizer.decode(got) == text
    r = random.Random(0)  # any ids, not only those of some text: byte ids may not be UTF-8 (each gives U+FFFD)
    for _ in range(200):
        ids = [r.randrange(tokenizer.vocab_size) for _ in range(r.randrange(1, 10))]
        assert hf_tok.decode(ids) == tokenizer.decode(ids), ids
    if kind == "char":  # a character outside the vocabulary fails in both
        with pytest.raises(ValueError):
            tokenizer.encode("Z€")
        with pytest.raises(Exception, match="UNK"):
            hf_tok("Z€")


def test_family_writes_another_class_that_holds_the_layout(tmp_path, capsys):
    """A LLaMA layout is Mistral's too: ``family=mistral`` writes MistralForCausalLM (not the LlamaForCausalLM
    the layout exports to by default), which gives archlab's logits."""
    tokenizer = TOKENIZERS["char"]()
    model = saved(tmp_path / "model.safetensors", LAYOUTS["char"][0], tokenizer, seed=3)
    main([str(tmp_path / "model.safetensors"), f"out={tmp_path / 'hf'}", "family=mistral"])
    assert "wrote MistralForCausalLM" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert type(hf).__name__ == "MistralForCausalLM"
    ids = tokenizer.encode(TEXT[:32])
    assert (logits(hf, ids) - logits(model.eval(), ids)).abs().max().item() < 1e-4


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_the_runs_eos_is_named_without_changing_any_encoding(kind, tmp_path, capsys):
    """A run whose data ends documents with a newline (``data.eos_id``): config.json and generation_config.json
    name it; the tokenizer's eos_token too where marking it special changes no encoding (a character of a char
    vocabulary), not for the byte tokenizer, whose newline symbol "Ċ" would then match that character in a
    text; archlab's tokenizer is carried beside (archlab_tokenizer.json)."""
    tokenizer = TOKENIZERS[kind]()
    eos = tokenizer.encode("\n")[0]
    saved(tmp_path / "run" / "model.safetensors", LAYOUTS[kind][0], tokenizer)
    data = {"_target_": "archlab.data.TokensDataModule", "dir": "shards", "eos_id": eos}
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"config": {"data": data}}))
    main([str(tmp_path / "run"), f"out={tmp_path / 'hf'}"])
    capsys.readouterr()
    for name in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "hf" / name).read_text())["eos_token_id"] == eos
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (hf_tok.eos_token, hf_tok.eos_token_id) == (("\n", eos) if kind == "char" else (None, None))
    for text in [TEXT, "a\nb\n\n", *(["Ċ and \u010a\n"] if kind == "byte" else [])]:
        assert hf_tok(text)["input_ids"] == tokenizer.encode(text), text
    assert json.loads((tmp_path / "hf" / "archlab_tokenizer.json").read_text()) == tokenizer.to_dict()


@pytest.fixture(scope="module")
def run(conf, tmp_path_factory):
    """A short training run with a char tokenizer, a checkpoint at step 2 and the final weights at step 4."""
    from archlab.training.run import train

    out = tmp_path_factory.mktemp("run")
    overrides = [
        "data.with_tokenizer=true",
        "trainer.max_steps=4",
        "scheduler.warmup_steps=1",
        "trainer.val_check_interval=2",
        "callbacks.checkpoint.save_top_k=-1",
        "callbacks.samples.num_samples=0",
    ]
    summary = train(compose_train(conf, out, overrides))
    assert summary["status"] == "completed"
    return out


def test_run_directory_exports_its_final_weights_and_a_checkpoint_its_own(run, tmp_path, capsys):
    main([str(run), f"out={tmp_path / 'final'}"])
    ckpt = run / "checkpoints" / "step000002.ckpt"
    main([str(ckpt), f"out={tmp_path / 'step2'}"])
    capsys.readouterr()

    state = torch.load(ckpt, weights_only=True, map_location="cpu")  # the checkpoint's own weights
    at_step2 = build_model(state["hyper_parameters"]["model"])
    at_step2.load_state_dict({k.removeprefix("model."): v for k, v in state["state_dict"].items()})
    final = load_weights(run / "model.safetensors")
    ids = list(range(12))
    for out, reference in (("final", final), ("step2", at_step2)):
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / out).eval()
        assert (logits(hf, ids) - logits(reference.eval(), ids)).abs().max().item() < 1e-5
        hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / out)  # TinyData's: a to p
        assert hf_tok("badge")["input_ids"] == [1, 0, 3, 6, 4] and hf_tok.decode([15, 0]) == "pa"
    assert (logits(final, ids) - logits(at_step2, ids)).abs().max().item() > 1e-3  # two different exports


def test_checkpoint_of_a_run_without_its_export_takes_the_tokenizer_of_its_data(run, tmp_path, capsys):
    """A run stopped before it exported: its summary's data settings give the tokenizer."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "model.safetensors").unlink()
    ckpt = copy / "checkpoints" / "step000002.ckpt"
    main([str(ckpt), f"out={tmp_path / 'hf'}"])
    assert "char tokenizer" in capsys.readouterr().out
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok("badge")["input_ids"] == [1, 0, 3, 6, 4]
    with pytest.raises(SystemExit):
        main([str(copy), f"out={tmp_path / 'again'}"])
    assert "holding model.safetensors" in capsys.readouterr().err


def _file(tmp_path, overrides, tokenizer=None):
    path = tmp_path / "m.safetensors"
    model = build_model(compose_model([*overrides, "model.vocab_size=256"]))
    meta = {TOKENIZER_KEY: json.dumps(tokenizer.to_dict())} if tokenizer else None
    save_weights(model, path, metadata=meta)
    return str(path)


@pytest.mark.parametrize(
    "make, settings, field, says",
    [
        (lambda t: str(t / "missing.safetensors"), [], "source", "nothing is at this path"),
        (lambda t: (t / "notes.txt").write_text("hi") and str(t / "notes.txt"), [], "source", ".ckpt"),
        (lambda t: _file(t, ["model=nano"], ByteTokenizer()), ["format=gguf"], "format", "['hf']"),
        (lambda t: _file(t, ["model=nano"]), [], "source", "tokenizer"),
        (  # every blocking field at once, with the nearest class
            lambda t: _file(
                t, ["model=nano", "model/norm=rmsnorm", "model/position=alibi", "model/block=parallel"], ByteTokenizer()
            ),
            [],
            "model.position.kind",
            "ArceeForCausalLM, the nearest Hugging Face class; also model.block.kind=pre (is parallel)",
        ),
        (lambda t: (t / "out" / "x").mkdir(parents=True) or _file(t, ["model=nano"], ByteTokenizer()), [], "out", "x"),
        (  # a family that does not hold the layout: those that do are listed
            lambda t: _file(t, ["model=nano"], ByteTokenizer()),
            ["family=llama"],
            "family",
            "a family that holds this layout exactly (model.position.kind is not LLaMA's): gpt2, opt, gpt_bigcode",
        ),
        (lambda t: _file(t, ["model=nano"], ByteTokenizer()), ["family=gpt9"], "family", ": gpt2, opt"),
    ],
)
def test_bad_input_is_one_line_before_any_work(make, settings, field, says, tmp_path, capsys):
    source = make(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([source, f"out={tmp_path / 'out'}", *settings])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}=") and says in err
    assert not (tmp_path / "out").exists() or [p.name for p in (tmp_path / "out").iterdir()] == ["x"]


def test_help_lists_the_settings(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: archlab-export [source=]<path>") and "out " in out and "format " in out


def test_importing_the_export_loads_no_lightning():
    """The export reads a run's files through archlab.run_files, not training/: a fresh process importing it
    has no Lightning loaded."""
    code = (
        "import sys, archlab.interop.export; print([m for m in ('lightning', 'pytorch_lightning') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_a_sharded_checkpoints_metadata_is_read_by_lightnings_name():
    from lightning.fabric.utilities.load import _METADATA_FILENAME

    assert SHARDED_METADATA == _METADATA_FILENAME


@pytest.mark.parametrize(
    "data",
    [
        {"dir": "shards"},  # relative to where training ran
        {"mixture": {"web": {"dir": "shards", "weight": 3}, "code": {"dir": "other", "weight": 1}}},
    ],
    ids=["dir", "mixture"],
)
def test_the_runs_eos_is_read_from_its_shards_as_training_read_them(data, tmp_path, monkeypatch):
    """A run trained from another directory on relative shard paths, or on a data mixture, still names its
    documents' EOS: the shards' meta.json, found against Hydra's record of where training ran."""
    trained_in, run = tmp_path / "project", tmp_path / "project" / "outputs" / "run"
    (trained_in / "shards").mkdir(parents=True)
    (trained_in / "shards" / "meta.json").write_text(json.dumps({"eos_id": 7, "vocab_size": 64}))
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  runtime:\n    cwd: {trained_in}\n")
    (run / "summary.json").write_text(json.dumps({"config": {"data": data}}))
    monkeypatch.chdir(tmp_path)  # elsewhere: "shards" alone names nothing here
    assert run_eos(run) == 7
    (run / ".hydra" / "hydra.yaml").unlink()  # without the record, the path is read as given
    assert run_eos(run) is None
