"""archlab-eval: the lm-eval adapter over an archlab Decoder gives lm-eval's own ``hf`` model's numbers on
an exported tiny model (every weight randomised; a local multiple-choice task written here, since no data
set can be downloaded), its rolling log-likelihoods and greedy generations match archlab's model computed
directly, and bad input is refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.hf import randomize

from archlab import build_model, compose_model
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.tokenizer import ByteTokenizer
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
TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def write_task(directory):
    """A local multiple-choice task: tiny_mc.yaml over tiny_mc.jsonl, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny_mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (directory / "tiny_mc.yaml").write_text(TASK.format(data=directory / "tiny_mc.jsonl"))
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
