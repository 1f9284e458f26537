"""Evaluation during training (``callbacks.evaluation``): the figures at the end of a run are archlab-eval's
on the run's saved weights, every evaluation reaches the loggers and summary.json with its cost, evaluating
leaves training's own course unchanged, and bad settings are refused naming the field before any step."""

from __future__ import annotations

import csv
import json
from typing import Any

import numpy as np
import pytest
import torch
from helpers.tasks import write_multiple_choice
from helpers.training import compose_train

from archlab.config.commands import EvalConfig
from archlab.errors import ConfigError
from archlab.tokenizer import CharTokenizer
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

ALPHABET = "abcdefghijklmnop"  # the tiny data's tokenizer (data.with_tokenizer=true, vocab 16)
RUN = ["data.with_tokenizer=true", "trainer.max_steps=10", "trainer.val_check_interval=5", "logger=csv"]
RUN += ["callbacks.samples=null", "model.dropout=0.1"]  # dropout: evaluation must leave its draws alone
RUN += ["callbacks.checkpoint.save_top_k=-1"]  # every validation's checkpoint kept, to resume from
ROWS = [
    {"question": "abcd", "choices": ["e", "k", "ponm"], "answer": 0},
    {"question": "fgh", "choices": ["a", "i"], "answer": 1},
    {"question": "jklmn", "choices": ["o", "b", "c"], "answer": 0},
]


def held_out(root):
    """Two named validation sets: a text file and a shard directory (val.bin, meta.json)."""
    tokenizer = CharTokenizer(ALPHABET)
    (root / "notes.txt").write_text("".join(ALPHABET[(3 * i) % 16] for i in range(150)))
    shards = root / "shards"
    shards.mkdir()
    np.array([(i * 5 + i // 7) % 16 for i in range(200)], dtype=np.uint16).tofile(shards / "val.bin")
    meta = {"vocab_size": 16, "dtype": "uint16", "tokenizer": tokenizer.to_dict()}
    (shards / "meta.json").write_text(json.dumps(meta))
    return {"notes": root / "notes.txt", "shards": shards}


def evaluation(sets, every=4, *more):
    return [
        f"callbacks.evaluation.every_n_steps={every}",
        "callbacks.evaluation.perplexity={" + ",".join(f"{k}:'{v}'" for k, v in sets.items()) + "}",
        *more,
    ]


@pytest.fixture(scope="module")
def evaluated(conf, tmp_path_factory):
    from archlab.training.run import train

    root = tmp_path_factory.mktemp("evaluated")
    sets = held_out(root)
    summary = train(compose_train(conf, root / "run", [*RUN, *evaluation(sets)]))
    return root, sets, summary


def test_the_last_evaluation_is_archlab_evals_on_the_saved_weights(evaluated):
    """Every 4 steps and after the 10th: the final figures of each set equal archlab-eval's perplexity of
    the run directory's model.safetensors (the same code on the same weights: to the last bit)."""
    from archlab.cli.eval import run

    root, sets, summary = evaluated
    found = summary["evaluation"]
    assert [h["step"] for h in found["history"]] == [4, 8, 10]
    for name, path in sets.items():
        _, results = run(EvalConfig(source=str(root / "run"), perplexity=str(path), out=str(root / name)))
        (figures,) = results.values()
        assert found["final"][f"eval/{name}/nll"] == figures["nll"]
        assert found["final"][f"eval/{name}/ppl"] == figures["ppl"]
    assert found["history"][0]["eval/notes/nll"] != found["final"]["eval/notes/nll"]  # it trained in between


def test_every_evaluation_reaches_the_log_and_its_cost_is_recorded(evaluated):
    root, _, summary = evaluated
    found = summary["evaluation"]
    with next((root / "run").rglob("metrics.csv")).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval/shards/ppl")]
    # at Lightning's step for that moment (steps done less one), as train/ and val/ are logged
    assert [int(r["step"]) for r in rows] == [3, 7, 9]
    assert [float(r["eval/shards/ppl"]) for r in rows] == [h["eval/shards/ppl"] for h in found["history"]]
    seconds = [h["seconds"] for h in found["history"]]
    assert found["seconds"] == pytest.approx(sum(seconds)) and all(s > 0 for s in seconds)
    assert found["seconds_per_evaluation"] == pytest.approx(sum(seconds) / 3)
    assert 0 < found["fraction_of_training"] < 1
    assert found["perplexity"] == {k: str(v) for k, v in evaluated[1].items()} and found["every_n_steps"] == 4


def test_the_trackers_summary_holds_the_final_evaluation_and_its_cost(evaluated):
    """What MLflow and W&B get at the end beside summary.json (``summary/...``)."""
    from archlab.training.loggers import summary_fields

    _, _, summary = evaluated
    fields = summary_fields(summary)
    for key, value in summary["evaluation"]["final"].items():
        assert fields[f"summary/final/{key}"] == value
    assert fields["summary/evaluation/seconds"] == summary["evaluation"]["seconds"]
    assert fields["summary/evaluation/fraction_of_training"] == summary["evaluation"]["fraction_of_training"]


def test_evaluating_leaves_the_training_run_as_it_was(evaluated, conf):
    """The same run without evaluation (dropout on): the same validation history, bit-identical weights."""
    from archlab.training.run import train

    root, _, summary = evaluated
    plain = train(compose_train(conf, root / "plain", RUN))
    assert "evaluation" not in plain
    assert summary["metrics"]["history"] == plain["metrics"]["history"]
    a = load_weights(root / "plain" / "model.safetensors").state_dict()
    b = load_weights(root / "run" / "model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_keeps_the_evaluations_before_its_checkpoint(evaluated, conf):
    """Resumed from the step-5 checkpoint: the evaluation at step 4 comes with it, 8 and 10 follow, every
    figure as in the uninterrupted run."""
    from archlab.training.run import train

    root, sets, summary = evaluated
    mid = root / "run" / "checkpoints" / "step000005.ckpt"
    resumed = train(compose_train(conf, root / "resumed", [*RUN, *evaluation(sets), f"ckpt_path={mid}"]))

    def figures(history):
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert figures(resumed["evaluation"]["history"]) == figures(summary["evaluation"]["history"])
    assert resumed["evaluation"]["history"][0] == summary["evaluation"]["history"][0]  # its seconds too


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"every_n_steps": 0, "perplexity": {"a": "NOTES"}}, "callbacks.evaluation.every_n_steps"),
        ({"every_n_steps": -5, "perplexity": {"a": "NOTES"}}, "callbacks.evaluation.every_n_steps"),
        ({"every_n_steps": True, "perplexity": {"a": "NOTES"}}, "callbacks.evaluation.every_n_steps"),
        ({"perplexity": {"a": "NOTES"}}, "callbacks.evaluation.every_n_steps"),  # sets, but off
        ({"every_n_steps": 5}, "callbacks.evaluation.perplexity"),  # on, with nothing to evaluate
        ({"every_n_steps": 5, "perplexity": {"a": "missing/dir"}}, "callbacks.evaluation.perplexity.a"),
        ({"every_n_steps": 5, "perplexity": {"a": "ROOT"}}, "callbacks.evaluation.perplexity.a"),  # no val.bin
        ({"every_n_steps": 5, "perplexity": {"a/b": "NOTES"}}, "callbacks.evaluation.perplexity"),
        ({"every_n_steps": 5, "perplexity": {"a": "NOTES"}, "batch_size": 0}, "callbacks.evaluation.batch_size"),
        ({"every_n_steps": 5, "perplexity": {"a": "NOTES"}, "limit": 1.5}, "callbacks.evaluation.limit"),
        ({"every_n_steps": 5, "perplexity": {"a": "NOTES"}, "include_path": "x"}, "callbacks.evaluation.include_path"),
        pytest.param(  # lm-eval's import: seconds
            {"every_n_steps": 5, "tasks": ["t"], "include_path": "missing/"},
            "callbacks.evaluation.include_path",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, settings, field):
    from archlab.evaluation.during_training import TrainingEvaluation

    (tmp_path / "notes.txt").write_text("abc")
    paths = {"NOTES": str(tmp_path / "notes.txt"), "ROOT": str(tmp_path)}
    given: dict[str, Any] = {
        k: ({n: paths.get(p, p) for n, p in v.items()} if k == "perplexity" else v) for k, v in settings.items()
    }
    if "tasks" in given:
        pytest.importorskip("lm_eval")
    with pytest.raises(ConfigError) as err:
        TrainingEvaluation(**given)
    assert err.value.field == field


def test_a_refused_setting_stops_the_run_before_the_data_is_read(conf, tmp_path):
    from archlab.training.run import train

    with pytest.raises(ConfigError) as err:
        train(compose_train(conf, tmp_path / "a", [*RUN, *evaluation(held_out(tmp_path), 0)]))
    assert err.value.field == "callbacks.evaluation.every_n_steps" and not (tmp_path / "a").exists()


def test_a_setting_the_data_refuses_stops_the_run_before_any_step(conf, tmp_path):
    """document_mask on a text file, which has no EOS to split documents at: a failed summary, no step."""
    from archlab.training.run import train

    more = evaluation(held_out(tmp_path), 4, "callbacks.evaluation.document_mask=true")
    with pytest.raises(ConfigError) as err:
        train(compose_train(conf, tmp_path / "b", [*RUN, *more]))
    assert err.value.field == "callbacks.evaluation.document_mask"
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 0


@pytest.mark.slow  # lm-eval's import and its data loading: a few seconds
def test_in_training_task_scores_are_archlab_evals_on_the_saved_weights(conf, tmp_path):
    """A local multiple-choice task every 5 steps: the last accuracy is archlab-eval's on the saved weights,
    and the run's course is the one it takes without evaluation."""
    pytest.importorskip("lm_eval")
    import datasets.config

    from archlab.cli.eval import run
    from archlab.training.run import train

    write_multiple_choice(tmp_path, "tiny_letters", ROWS, delimiter="")
    tasks = ["callbacks.evaluation.tasks=[tiny_letters]", f"callbacks.evaluation.include_path={tmp_path}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
        summary = train(compose_train(conf, tmp_path / "run", [*RUN, "callbacks.evaluation.every_n_steps=5", *tasks]))
        _, results = run(EvalConfig(source=str(tmp_path / "run"), tasks=["tiny_letters"], include_path=str(tmp_path)))
    found = summary["evaluation"]
    assert [h["step"] for h in found["history"]] == [5, 10]
    assert found["final"] == {"eval/tiny_letters/acc": results["tiny_letters"]["acc,none"]}
    plain = train(compose_train(conf, tmp_path / "plain", RUN))  # lm-eval seeds every RNG; dropout is on
    assert summary["metrics"]["history"] == plain["metrics"]["history"]


@pytest.mark.slow  # two spawned processes: about 2 minutes on a busy 2-core CPU
def test_under_ddp_rank_zero_evaluates_and_the_figures_are_archlab_evals(conf, tmp_path):
    """Two spawned CPU processes: rank 0 evaluates while rank 1 waits; the run's last figures are
    archlab-eval's on the weights it saved."""
    from archlab.cli.eval import run
    from archlab.training.run import train

    sets = held_out(tmp_path)
    ddp = ["trainer=ddp_spawn", "trainer.accelerator=cpu", "data.batch_size=4"]
    summary = train(compose_train(conf, tmp_path / "run", [*RUN, *ddp, *evaluation(sets)]))
    assert summary["trainer"]["world_size"] == 2
    found = summary["evaluation"]
    assert [h["step"] for h in found["history"]] == [4, 8, 10]
    _, results = run(EvalConfig(source=str(tmp_path / "run"), perplexity=str(sets["notes"]), out=str(tmp_path / "e")))
    assert found["final"]["eval/notes/nll"] == results["perplexity:notes.txt"]["nll"]
