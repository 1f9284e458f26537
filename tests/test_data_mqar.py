"""data=mqar: sequence structure against a pair-by-pair reading, determinism, lengths, chance, errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from archlab.data import MQARDataModule
from archlab.data.stream import BatchStream, batch_rng, stream_loader
from archlab.errors import ConfigError


def read_sequence(inputs: list[int], targets: list[int], pairs: int):
    """Independent reading of one row: the context's key -> value dict and the scored positions."""
    context = dict(zip(inputs[0 : 2 * pairs : 2], inputs[1 : 2 * pairs : 2]))
    scored = [t for t, y in enumerate(targets) if y != -100]
    return context, scored


@pytest.mark.parametrize("pairs,queries,eval_pairs", [(3, None, None), (4, 7, 5), (8, None, 16)])
def test_answers_are_the_values_of_the_queried_keys(pairs, queries, eval_pairs):
    dm = MQARDataModule(
        num_pairs=pairs,
        num_queries=queries,
        num_keys=20,
        num_values=10,
        eval_num_pairs=eval_pairs,
        val_examples=200,
        seed=5,
    )
    dm.setup()
    n_queries = pairs if queries is None else queries
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (dm.batch_size, 2 * (pairs + n_queries) - 1) and x.dtype == y.dtype == torch.long
    for inputs, targets in zip(x.tolist(), y.tolist()):
        context, scored = read_sequence(inputs, targets, pairs)
        keys = inputs[0 : 2 * pairs : 2]
        assert len(set(keys)) == pairs and all(0 <= k < 20 for k in keys)  # distinct keys from the key range
        assert all(20 <= v < 30 for v in inputs[1 : 2 * pairs : 2])  # values from the value range
        assert scored == [2 * pairs + 2 * j for j in range(n_queries)]  # one answer after each question
        for t in scored:
            assert inputs[t] in context and targets[t] == context[inputs[t]]
            if t + 1 < len(inputs):
                assert inputs[t + 1] == targets[t]  # the answer follows its question in the input


def test_questions_repeat_keys_so_elimination_cannot_answer():
    dm = MQARDataModule(num_pairs=8, val_examples=500, seed=0)
    dm.setup()
    x, _ = dm.val_sets[0]
    questions = x[:, 16::2]
    repeated = sum(len(set(row)) < len(row) for row in questions.tolist())
    # drawn with replacement, all 8 questions differ with probability 8!/8^8 = 0.24%
    assert repeated >= 0.98 * len(questions)


def test_val_long_has_eval_num_pairs_and_sets_max_seq_len():
    dm = MQARDataModule(num_pairs=4, num_keys=16, val_examples=50)
    assert dm.eval_num_pairs == 8 and dm.max_seq_len == 2 * (8 + 8) - 1
    assert dm.vocab_size == 16 + 32 and dm.val_names == ["val", "val_long"]
    dm.setup()
    (xv, yv), (xl, yl) = dm.val_sets
    assert xv.shape == (50, 15) and xl.shape == (50, 31)
    for inputs, targets in zip(xl.tolist(), yl.tolist()):
        context, scored = read_sequence(inputs, targets, 8)
        assert len(context) == 8 and all(targets[t] == context[inputs[t]] for t in scored)
    loaders = dm.val_dataloader()
    assert [sum(len(b[0]) for b in loader) for loader in loaders] == [50, 50]
    shorter = MQARDataModule(num_pairs=4, num_keys=16, eval_num_pairs=2, num_queries=3)
    assert shorter.max_seq_len == 2 * (4 + 3) - 1  # the training length when it is the longer


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = (MQARDataModule(num_pairs=4, val_examples=64, seed=s) for s in (1, 1, 2))
    for dm in (a, b, c):
        dm.setup()
    for (xa, ya), (xb, yb), (xc, _) in zip(a.val_sets, b.val_sets, c.val_sets):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and not torch.equal(xa, xc)
    stream = [next(iter(dm.train_dataloader())) for dm in (a, b, c)]
    assert torch.equal(stream[0][0], stream[1][0]) and not torch.equal(stream[0][0], stream[2][0])
    # the fixed validation set is not a piece of the training stream
    assert not torch.equal(a.val_sets[0][0][: a.batch_size], stream[0][0])


def test_ranks_share_the_global_batch_of_one_process():
    dm = MQARDataModule(num_pairs=3, num_keys=8, num_values=8)
    make = dm.batch_fn(3)
    whole = BatchStream(make, seed=4, batch_size=6).batch(7)
    halves = [BatchStream(make, seed=4, batch_size=3, rank=r, world_size=2).batch(7) for r in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), whole[0])
    assert torch.equal(torch.cat([h[1] for h in halves]), whole[1])


def test_stream_resumes_after_the_batches_a_trainer_has_seen():
    dm = MQARDataModule(num_pairs=3, num_keys=8, num_values=8, batch_size=4)
    fresh = iter(dm.train_dataloader())
    first = [next(fresh) for _ in range(5)]
    progress = SimpleNamespace(total=SimpleNamespace(ready=3))
    trainer = SimpleNamespace(
        global_rank=0, world_size=1, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    )
    resumed = iter(stream_loader(dm.batch_fn(3), dm.seed, 4, 0, trainer))
    assert torch.equal(next(resumed)[0], first[3][0]) and torch.equal(next(resumed)[0], first[4][0])


def test_workers_do_not_change_the_stream():
    plain = MQARDataModule(num_pairs=3, num_keys=8, num_values=8, seed=9)
    workers = MQARDataModule(num_pairs=3, num_keys=8, num_values=8, seed=9, num_workers=2)
    a, b = iter(plain.train_dataloader()), iter(workers.train_dataloader())
    for _ in range(5):
        assert torch.equal(next(a)[0], next(b)[0])


def test_chance_is_one_over_the_values_and_answers_are_uniform():
    dm = MQARDataModule(num_pairs=4, num_values=8, val_examples=2000, seed=3)
    dm.setup()
    assert dm.chance_accuracy == 1 / 8
    _, y = dm.val_sets[0]
    answers = y[y != -100]
    freq = torch.bincount(answers - dm.num_keys, minlength=8).float() / len(answers)
    # 8000 answers: each value's share is within 5 standard errors of 1/8
    assert torch.all((freq - 1 / 8).abs() < 5 * np.sqrt(1 / 8 * 7 / 8 / len(answers)))
    # guessing one fixed value therefore scores about the stated chance
    assert abs(float((answers == dm.num_keys).float().mean()) - dm.chance_accuracy) < 0.02


def test_batch_rng_streams_are_independent_of_each_other():
    a = batch_rng(0, 0, 0).integers(0, 2**31, 4)
    assert not np.array_equal(a, batch_rng(0, 1, 0).integers(0, 2**31, 4))
    assert not np.array_equal(a, batch_rng(0, 0, 1).integers(0, 2**31, 4))
    assert np.array_equal(a, batch_rng(0, 0, 0).integers(0, 2**31, 4))


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_pairs": 0}, "data.num_pairs"),
        ({"num_pairs": 8, "num_keys": 12}, "data.num_keys"),  # val_long needs 16 distinct keys
        ({"num_pairs": 4, "eval_num_pairs": 0}, "data.eval_num_pairs"),
        ({"num_queries": 0}, "data.num_queries"),
        ({"num_values": 0}, "data.num_values"),
        ({"batch_size": 2.5}, "data.batch_size"),
        ({"num_workers": -1}, "data.num_workers"),
        ({"val_examples": 0}, "data.val_examples"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        MQARDataModule(**kwargs)
    assert err.value.field == field


def test_train_pairs_mix_counts_per_batch_and_val_pairs_score_each_count():
    dm = MQARDataModule(num_pairs=2, num_queries=3, num_keys=12, num_values=10, train_pairs=[2, 5, 9], val_pairs=[5, 9])
    dm.setup()
    assert dm.val_names == ["val", "val_p5", "val_p9"] and dm.max_seq_len == 2 * (9 + 3) - 1
    assert [x.shape[1] for x, _ in dm.val_sets] == [2 * (n + 3) - 1 for n in (2, 5, 9)]
    stream = iter(dm.train_dataloader())
    seen = {}
    for _ in range(60):
        x, y = next(stream)
        pairs = (x.shape[1] + 1) // 2 - 3  # the batch's count, from its length
        seen[pairs] = seen.get(pairs, 0) + 1
        for inputs, targets in zip(x.tolist(), y.tolist()):
            context, scored = read_sequence(inputs, targets, pairs)
            assert len(context) == pairs and scored == [2 * pairs + 2 * j for j in range(3)]
            assert all(targets[t] == context[inputs[t]] for t in scored)
    # every count drawn, each about a third of 60 batches (binomial sd 3.7)
    assert set(seen) == {2, 5, 9} and all(8 <= c <= 32 for c in seen.values())


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"train_pairs": []}, "data.train_pairs"),
        ({"train_pairs": [4, 4]}, "data.train_pairs"),
        ({"val_pairs": [0]}, "data.val_pairs"),
        ({"val_pairs": [4], "eval_num_pairs": 4}, "data.eval_num_pairs"),
        ({"train_pairs": [4, 40]}, "data.num_keys"),  # 40 distinct keys from 32
        ({"val_pairs": [40]}, "data.num_keys"),
    ],
)
def test_bad_pair_lists_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        MQARDataModule(num_pairs=4, **kwargs)
    assert err.value.field == field
