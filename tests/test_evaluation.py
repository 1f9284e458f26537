"""archlab-eval: the lm-eval adapter over an archlab Decoder gives lm-eval's own ``hf`` model's numbers on
an exported tiny model (every weight randomised; a local multiple-choice task written here, since no data
set can be downloaded), its rolling log-likelihoods and greedy generations match archlab's model computed
directly, and bad input is refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.hf import randomize
from helpers.tasks import write_multiple_choice

from archlab import build_model, compose_model
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.tokenizer import BPETokenizer, ByteTokenizer
from archlab.weights import TOKENIZER_KEY, save_weights

pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CTX = 48
LAYOUT = ["model=llama2-7b", f"model.context_length={CTX}", "model.n_layer=2", "model.d_model=32"]
LAYOUT += ["model.attention.n_head=4", "model.attention.n_kv_head=2", "model.mlp.d_ff=48", "model.vocab_size=256"]
ROWS = [
    {"question": "The sky is", "choices": ["blue", "green", "loud"], "answer": 0},
    {"question": "Two plus two is", "choices": ["four", "five"], "answer": 0},
    {"question": "Fire is", "choices": ["cold", "hot", "wet", "made of a very long word indeed"], "answer": 1},
    {"question": "x" * 60, "choices": ["truncated from the left", "y"], "answer": 0},  # longer than the context
]


ROLLING = """task: tiny_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}}"
metric_list:
  - metric: bits_per_byte
"""


def write_task(directory):
    """Local tasks over tiny_mc.jsonl, in ``directory``: multiple choice (tiny_mc.yaml) and the questions'
    rolling log-likelihoods (tiny_rolling.yaml)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = write_multiple_choice(directory, "tiny_mc", ROWS)
    (directory / "tiny_rolling.yaml").write_text(ROLLING.format(data=data))
    return directory


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random tiny Llama-layout model with the byte tokenizer, saved as training saves it and exported
    to a Hugging Face directory; datasets' cache kept in the test's directory."""
    import datasets

    from archlab.cli.export import main as export

    root = tmp_path_factory.mktemp("evaluation")
    model = randomize(build_model(compose_model(LAYOUT)), 0).eval()
    save_weights(model, root / "model.safetensors", metadata={TOKENIZER_KEY: json.dumps(ByteTokenizer().to_dict())})
    export([str(root / "model.safetensors"), f"out={root / 'hf'}"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "datasets"))
        yield root, model, write_task(root / "tasks")


def archlab_lm(model, **kwargs):
    from archlab.evaluation.harness import ArchlabLM

    return ArchlabLM(model, ByteTokenizer(), **kwargs)


def test_adapter_matches_lm_evals_hf_model_on_an_exported_model(exported):
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    root, model, tasks = exported
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    hf = HFLM(pretrained=str(root / "hf"), device="cpu", batch_size=3, prefix_token_id=10)
    found = {}
    for name, lm in (("hf", hf), ("archlab", archlab_lm(model, batch_size=2))):
        found[name] = simple_evaluate(model=lm, tasks=["tiny_mc"], task_manager=manager, log_samples=True)
    samples = {name: {s["doc_id"]: s for s in r["samples"]["tiny_mc"]} for name, r in found.items()}
    assert sorted(samples["hf"]) == sorted(samples["archlab"]) == list(range(len(ROWS)))
    for doc_id, theirs in samples["hf"].items():
        ours = samples["archlab"][doc_id]
        assert ours["arguments"] == theirs["arguments"]
        for (a, greedy_a), (b, greedy_b) in zip((r[0] for r in ours["resps"]), (r[0] for r in theirs["resps"])):
            assert abs(a - b) < 1e-4 and greedy_a == greedy_b, (doc_id, a, b)
    assert found["archlab"]["results"]["tiny_mc"]["acc,none"] == found["hf"]["results"]["tiny_mc"]["acc,none"]


def test_rolling_loglikelihood_is_every_token_scored_once(exported):
    """A text three contexts long: the sum of each token's log-probability given everything before it
    (the first given the prefix token), within the context, as lm-eval's rolling windows score it."""
    from lm_eval.api.instance import Instance

    _, model, _ = exported
    text = "".join(chr(ord("a") + (i * 7) % 26) for i in range(2 * CTX + 11))
    ids = [10, *ByteTokenizer().encode(text)]
    expected = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, CTX):  # each window scores CTX new tokens, given full context
            end = min(start + CTX, len(ids) - 1)
            first = max(0, end - CTX)
            logprobs = torch.log_softmax(model(torch.tensor([ids[first:end]])).float()[0], -1)
            targets = ids[first + 1 : end + 1]
            expected += sum(logprobs[t, targets[t]].item() for t in range(start - first, end - first))
    request = Instance("loglikelihood_rolling", {}, (text,), 0)
    (got,) = archlab_lm(model, batch_size=2, prefix_token_id=10).loglikelihood_rolling([request])
    assert abs(got - expected) < 1e-3


def test_generate_until_is_greedy_decoding_cut_at_the_stop(exported):
    from lm_eval.api.instance import Instance

    _, model, _ = exported
    tok = ByteTokenizer()
    prompts = ["Once upon", "A much longer prompt than that"]
    requests = [
        Instance("generate_until", {}, (p, {"until": ["q"], "max_gen_toks": 6}), i) for i, p in enumerate(prompts)
    ]
    got = archlab_lm(model, batch_size=2).generate_until(requests)
    for prompt, text in zip(prompts, got):
        ids = generate(model, torch.tensor([tok.encode(prompt)]), 6)[0, len(tok.encode(prompt)) :].tolist()
        assert text == tok.decode(ids).split("q")[0]


def test_scoring_from_the_start_without_an_eos_is_refused(exported):
    from lm_eval.api.instance import Instance

    with pytest.raises(ConfigError) as refused:
        archlab_lm(exported[1]).loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("abc",), 0)])
    assert refused.value.field == "prefix_token_id"


def choice_loglikelihood(model, question, choice):
    """log p(" " + choice | question) under ``model``, token by token (lm-eval's target delimiter is a space)."""
    tok = ByteTokenizer()
    context, continuation = tok.encode(question), tok.encode(" " + choice)
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids[:, :-1]).float()[0], -1)
    return sum(logprobs[len(context) - 1 + i, t].item() for i, t in enumerate(continuation))


def test_the_command_writes_task_metrics_and_perplexity_into_one_results_file(exported, capsys):
    from archlab.cli.eval import main

    root, model, tasks = exported
    weights = str(root / "model.safetensors")
    main([weights, "tasks=[tiny_mc]", f"include_path={tasks}", "limit=3", "batch_size=2"])
    main([weights, "tasks=[tiny_rolling]", f"include_path={tasks}", "prefix_token_id=10"])
    text = root / "held_out.txt"
    text.write_text("abcdefghij" * 9)
    main([weights, f"perplexity={text}", "seq_len=32", "stride=16"])
    assert f"wrote {root / 'eval' / 'results.json'}" in capsys.readouterr().out
    results = json.loads((root / "eval" / "results.json").read_text())["results"]
    right = [
        max(range(len(r["choices"])), key=lambda c: choice_loglikelihood(model, r["question"], r["choices"][c]))
        == r["answer"]
        for r in ROWS[:3]  # limit=3
    ]
    assert results["tiny_mc"]["acc,none"] == pytest.approx(sum(right) / 3)
    assert results["perplexity:held_out.txt"]["tokens"] == 89 and results["perplexity:held_out.txt"]["ppl"] > 1
    assert results["tiny_rolling"]["bits_per_byte,none"] > 0  # the rolling task ran with the prefix given


@pytest.mark.parametrize(
    "args, field",
    [
        (["tasks=[tiny_mc]", "batch_size=0"], "batch_size"),
        (["tasks=[tiny_mc]", "limit=0"], "limit"),
        (["tasks=[tiny_mc]", "limit=2.5"], "limit"),
        (["tasks=[tiny_mc]", "num_fewshot=-1"], "num_fewshot"),
        (["tasks=[tiny_mc]", "include_path=no/such/dir"], "include_path"),
        (["tasks=[tiny_mc]", "seq_len=8"], "seq_len"),
        (["tasks=[]"], "tasks"),
        ([], "tasks"),
        (["tasks=[tiny_mc]", "perplexity=held_out.txt"], "tasks"),
        (["perplexity=no_such.txt"], "perplexity"),
        (["perplexity=held_out.txt", "stride=64"], "stride"),
        (["perplexity=held_out.txt", "seq_len=49"], "seq_len"),
        (["perplexity=held_out.txt", "document_mask=true"], "document_mask"),
        (["perplexity=held_out.txt", "limit=3"], "limit"),
        (["perplexity=held_out.txt", "device=tpu"], "device"),
        (["tasks=[tiny_rolling]", "include_path=tasks"], "prefix_token_id"),  # the byte tokenizer has no EOS
    ],
)
def test_bad_settings_are_refused_naming_the_field_before_any_work(exported, args, field, monkeypatch):
    from archlab.cli.eval import EvalConfig, run
    from archlab.cli.settings import parse

    root, _, tasks = exported
    monkeypatch.chdir(root)
    (root / "held_out.txt").write_text("abcdefghij" * 9)
    args = [a.replace("include_path=tasks", f"include_path={tasks}") for a in args]
    cfg = parse(EvalConfig, [str(root / "model.safetensors"), *args], bare="source")
    before = sorted(p.name for p in root.rglob("*"))
    with pytest.raises(ConfigError) as refused:
        run(cfg)
    assert refused.value.field == field
    assert sorted(p.name for p in root.rglob("*")) == before


def test_a_missing_or_tokenizerless_model_is_refused(tmp_path):
    from archlab.cli.eval import EvalConfig, run

    with pytest.raises(ConfigError) as refused:
        run(EvalConfig(source=str(tmp_path / "none.safetensors"), perplexity="x.txt"))
    assert refused.value.field == "source"
    save_weights(build_model(compose_model(LAYOUT)), tmp_path / "bare.safetensors")
    with pytest.raises(ConfigError, match="tokenizer") as refused:
        run(EvalConfig(source=str(tmp_path / "bare.safetensors"), perplexity="x.txt"))
    assert refused.value.field == "source"


def hand_nll(model, ids, seq_len, stride, eos_id=None):
    """The mean over targets t >= 1 of -log p(ids[t] | its context): the tokens from the start of the first
    window scoring t (the least multiple of ``stride`` at most ``seq_len`` before t), and with ``eos_id``
    only those of the document of ids[t - 1] (an EOS ends its own document), from position 0."""
    total = 0.0
    for t in range(1, len(ids)):
        start = max(0, -(-(t - seq_len) // stride)) * stride
        if eos_id is not None:
            ends = [j for j in range(t - 1) if ids[j] == eos_id]
            start = max(start, ends[-1] + 1 if ends else 0)
        with torch.no_grad():
            logits = model(torch.tensor([ids[start:t]])).float()[0, -1]
        total -= torch.log_softmax(logits, -1)[ids[t]].item()
    return total / (len(ids) - 1)


@pytest.mark.parametrize("seq_len, stride", [(8, 8), (8, 3), (48, 48)])
def test_perplexity_of_a_text_is_the_hand_computed_mean_nll(exported, tmp_path, seq_len, stride):
    from archlab.evaluation.perplexity import perplexity, read_held_out

    _, model, _ = exported
    (tmp_path / "held_out.txt").write_text("the quick brown fox jumps over the lazy dog")
    held_out = read_held_out(str(tmp_path / "held_out.txt"), ByteTokenizer(), 256)
    found = perplexity(model, held_out, seq_len, stride, batch_size=2)
    expected = hand_nll(model, held_out.ids.tolist(), seq_len, stride)
    assert found["tokens"] == len(held_out.ids) - 1 and found["nll"] == pytest.approx(expected, abs=1e-5)


def test_perplexity_on_shards_keeps_to_documents_as_training_does(exported, tmp_path):
    """Shards whose meta.json names an EOS: with document_mask and reset_positions each target is predicted
    from its own document's tokens alone, from position 0."""
    import numpy as np

    from archlab.evaluation.perplexity import perplexity, read_held_out

    _, model, _ = exported
    ids = ByteTokenizer().encode("one fish\ntwo fish\nred fish\nblue fish, and a last longer document\n")
    np.array(ids, dtype=np.uint16).tofile(tmp_path / "val.bin")
    meta = {"vocab_size": 256, "dtype": "uint16", "tokenizer": ByteTokenizer().to_dict(), "eos_id": 10}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    held_out = read_held_out(str(tmp_path), ByteTokenizer(), 256)
    assert held_out.name == f"perplexity:{tmp_path.name}/val.bin" and held_out.eos_id == 10
    found = perplexity(model, held_out, 16, 16, document_mask=True, reset_positions=True)
    assert found["nll"] == pytest.approx(hand_nll(model, ids, 16, 16, eos_id=10), abs=1e-5)
    across = perplexity(model, held_out, 16, 16)
    assert across["nll"] == pytest.approx(hand_nll(model, ids, 16, 16), abs=1e-5)
    assert abs(across["nll"] - found["nll"]) > 1e-3  # the mask changes what is predicted from


def test_an_export_and_a_checkpoint_are_evaluated_as_the_model_they_hold(exported, tmp_path):
    """An archlab-export directory, and a training checkpoint in the run (its tokenizer the run's), give
    the perplexity of the safetensors file they came from."""
    from archlab.cli.eval import main
    from archlab.config.model import model_config_dict

    root, model, _ = exported
    (root / "checkpoints").mkdir(exist_ok=True)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {"hyper_parameters": {"model": model_config_dict(model.cfg)}, "state_dict": state},
        root / "checkpoints" / "last.ckpt",
    )
    (tmp_path / "held_out.txt").write_text("exported and evaluated again " * 3)
    sources = {"file": root / "model.safetensors", "hf": root / "hf", "ckpt": root / "checkpoints" / "last.ckpt"}
    for name, source in sources.items():
        main([str(source), f"perplexity={tmp_path / 'held_out.txt'}", f"out={tmp_path / name}"])
    nll = {
        n: json.loads((tmp_path / n / "results.json").read_text())["results"]["perplexity:held_out.txt"]["nll"]
        for n in sources
    }
    assert nll["hf"] == pytest.approx(nll["file"], abs=1e-5) and nll["ckpt"] == pytest.approx(nll["file"], abs=1e-6)


def bpe_run(root, layout):
    """A run as training leaves one on archlab-prepare's shards of the rows' texts: documents ending with
    its BPE's EOS (in meta.json), the summary's data settings naming the shards, the final weights (random, of
    the config ``layout`` at the BPE's vocabulary) with the tokenizer; returns the run, the shards and the EOS."""
    import dataclasses

    import numpy as np

    texts = [r["question"] for r in ROWS] + [" ".join(r["choices"]) for r in ROWS]
    tok = BPETokenizer.fit(texts, 300, special_tokens=["<|endoftext|>"])
    eos = tok.tok.token_to_id("<|endoftext|>")
    shards, run = root / "shards", root / "run"
    shards.mkdir()
    ids = [i for text in texts for i in [*tok.encode(text), eos]]
    np.array(ids, dtype=np.uint16).tofile(shards / "val.bin")
    meta = {"vocab_size": tok.vocab_size, "dtype": "uint16", "tokenizer": tok.to_dict(), "eos_id": eos}
    (shards / "meta.json").write_text(json.dumps(meta))
    model = randomize(build_model(dataclasses.replace(layout, vocab_size=tok.vocab_size)), 1)
    save_weights(model, run / "model.safetensors", metadata={TOKENIZER_KEY: json.dumps(tok.to_dict())})
    data = {"_target_": "archlab.data.TokensDataModule", "dir": str(shards), "eos_id": None}
    (run / "summary.json").write_text(json.dumps({"status": "completed", "config": {"data": data}}))
    return run, shards, eos


def test_an_export_is_evaluated_as_the_run_it_came_from(exported, tmp_path, monkeypatch):
    """The export of a run on BPE shards names the shards' EOS (config.json, the tokenizer's eos_token) and
    carries the shards' tokenizer: a rolling task conditioned on that EOS and the perplexity of the run's own
    shards give the run directory's numbers."""
    import lm_eval.evaluator

    from archlab.cli.eval import main
    from archlab.cli.export import main as export

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)  # `pip list`: 3 s a call
    _, model, tasks = exported
    run, shards, eos = bpe_run(tmp_path, model.cfg)
    export([str(run), f"out={tmp_path / 'hf'}"])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == eos
    assert transformers_tokenizer(tmp_path / "hf").eos_token_id == eos
    found = {}
    for name, source in (("run", run), ("hf", tmp_path / "hf")):
        out = tmp_path / f"eval_{name}"
        main([str(source), "tasks=[tiny_rolling]", f"include_path={tasks}", f"out={out}"])
        main([str(source), f"perplexity={shards}", "document_mask=true", f"out={out}"])
        found[name] = json.loads((out / "results.json").read_text())["results"]
    held_out = f"perplexity:{shards.name}/val.bin"
    assert found["hf"][held_out]["nll"] == pytest.approx(found["run"][held_out]["nll"], abs=1e-5)
    assert found["hf"][held_out]["tokens"] == found["run"][held_out]["tokens"] > 0
    score = "bits_per_byte,none"
    assert found["hf"]["tiny_rolling"][score] == pytest.approx(found["run"]["tiny_rolling"][score], abs=1e-5)


def transformers_tokenizer(path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.slow  # indexing lm-eval's own 14,000 task configs takes about 17 s
def test_an_unknown_task_is_refused_with_the_local_and_the_closest_names(exported):
    from archlab.evaluation.harness import task_manager

    _, _, tasks = exported
    with pytest.raises(ConfigError, match=r"tiny_mc.*hellaswag") as refused:
        task_manager(["hellaswg"], str(tasks))
    assert refused.value.field == "tasks"


@pytest.fixture(scope="module")
def gpt2_export(exported):
    """A random tiny GPT-2 (learned positions: n_positions sizes a tensor) exported, with the byte tokenizer."""
    from archlab.cli.export import main as export

    root = exported[0] / "gpt2"
    sizes = ["model=gpt2", f"model.context_length={CTX}", "model.n_layer=2", "model.d_model=32"]
    model = randomize(build_model(compose_model([*sizes, "model.attention.n_head=4", "model.vocab_size=256"])), 3)
    save_weights(model, root / "model.safetensors", metadata={TOKENIZER_KEY: json.dumps(ByteTokenizer().to_dict())})
    export([str(root / "model.safetensors"), f"out={root / 'hf'}"])
    return root / "hf"


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("n_layer", 3, "config.json: n_layer=3 is invalid: allowed 2, the layers"),
        ("n_layer", 1, "config.json: n_layer=1 is invalid: allowed 2, the layers"),
        ("vocab_size", 300, "config.json: vocab_size=300 is invalid: allowed 256, the embedding rows"),
        ("n_positions", 64, "config.json: n_positions=64 is invalid: allowed 48, the position rows"),
        ("n_embd", 64, "config.json: n_embd=64 is invalid: allowed 32, the width"),
        ("model_type", "bert", "config.json: model_type='bert' is invalid: allowed a model_type archlab converts"),
        (None, None, "config.json' is invalid: allowed a config.json that is JSON (Expecting"),
    ],
)
def test_an_edited_config_json_is_one_line_naming_the_file_and_the_key(gpt2_export, tmp_path, key, value, says, capsys):
    """An export whose config.json was edited (or broken): archlab-eval and archlab-generate print one line
    naming config.json and the key, with what the weights hold, before any weights are read."""
    import shutil

    from archlab.cli.eval import main
    from archlab.cli.generate import main as generate

    hf = tmp_path / "hf"
    shutil.copytree(gpt2_export, hf)
    config = hf / "config.json"
    if key is None:
        config.write_text(config.read_text().rstrip().rstrip("}") + ",}")
    else:
        config.write_text(json.dumps({**json.loads(config.read_text()), key: value}))
    (tmp_path / "held_out.txt").write_text("abcdefghij" * 9)
    for command, args in ((main, [f"perplexity={tmp_path / 'held_out.txt'}"]), (generate, ["prompt_ids=[1]"])):
        with pytest.raises(SystemExit) as exit:
            command([str(hf), *args])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and len(err.strip().splitlines()) == 1 and str(config) in err, err
        assert says in err, err
    assert not (hf / "eval").exists()


@pytest.mark.parametrize(
    "edit, says",
    [
        (("doc_to_target", "doc_to_targt"), "doc_to_targt is no field of an lm-eval task (closest: doc_to_target"),
        (("output_type: multiple_choice", "output_type: multiple_choise"), "invalid output_type 'multiple_choise'"),
        (("tiny_mc.jsonl", "no_such.jsonl"), "FileNotFoundError"),
    ],
)
def test_a_task_config_lm_eval_cannot_build_is_one_line_naming_its_file(exported, tmp_path, edit, says, capsys):
    """A local task's YAML with a misspelt field, a value lm-eval refuses or data it cannot find: one line
    naming the task, its YAML file and the field, before the model's weights are read."""
    from archlab.cli.eval import main

    root, _, tasks = exported
    yaml = tmp_path / "tiny_typo.yaml"
    yaml.write_text((tasks / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: tiny_typo").replace(*edit))
    with pytest.raises(SystemExit) as exit:
        main([str(root / "model.safetensors"), "tasks=[tiny_typo]", f"include_path={tmp_path}", f"out={tmp_path}"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: tasks='tiny_typo' is invalid") and f"{yaml}: " in err and says in err, err
