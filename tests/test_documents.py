"""Document masking on packed rows (data.document_mask, data.reset_positions): the mask against a
hand-built block-diagonal one, a packed row's logits against each document run alone, positions that
continue across documents against a shifted position table, the refusals, and a two-step run (with a
recurrent mixer too: tests/test_mixer_contract.py checks each mixer's packed documents)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from archlab import build_model
from archlab.build import compose
from archlab.config import to_model_config
from archlab.data import TokensDataModule
from archlab.data.windows import ValidationWindows
from archlab.errors import ConfigError
from archlab.nn.loss import next_token_loss
from archlab.nn.model import Decoder, document_ids, document_inputs, document_positions
from archlab.training.module import LitModel
from archlab.training.run import train
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
EOS = 15
# two rows of 12 packed tokens: each document but a row's last ends with its EOS (the window cuts the last)
ROWS = [
    [[3, 1, 4, EOS], [1, 5, 9, 2, 6, EOS], [5, 3]],
    [[7, EOS], [2, 2, 8, 1, 0, EOS], [4, 4, 4, 3]],
]


def tiny(**overrides):
    """d_model 32, 4 heads of 8, 2 layers, vocab 16, context 16, no position scheme unless set."""
    base = {
        "vocab_size": 16,
        "context_length": 16,
        "n_layer": 2,
        "d_model": 32,
        "position": {"kind": "none"},
        "attention": {"n_head": 4},
    }
    return to_model_config(OmegaConf.merge(base, overrides))


def build(cfg):
    """A float64 model with every weight random (a bias or norm scale at its init would hide a mistake)."""
    torch.manual_seed(0)
    model = build_model(cfg, dtype=F64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (0.5 if p.ndim == 1 else 0.0))
    return model


def packed() -> torch.Tensor:
    return torch.tensor([sum(row, []) for row in ROWS])


def test_document_ids_and_positions_by_hand():
    documents = document_ids(packed(), EOS)
    assert documents.tolist() == [[0] * 4 + [1] * 6 + [2] * 2, [0] * 2 + [1] * 6 + [2] * 4]
    assert document_positions(documents).tolist() == [
        [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1],
        [0, 1, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3],
    ]
    row = torch.tensor([[EOS, 7, EOS, EOS, 2]])  # an EOS first, and two in a row: one-token documents
    assert document_ids(row, EOS).tolist() == [[0, 1, 1, 2, 3]]
    assert document_positions(document_ids(row, EOS)).tolist() == [[0, 0, 1, 0, 0]]
    assert set(document_inputs(row, EOS, reset_positions=False)) == {"document_ids"}


def test_mask_is_block_diagonal_and_lower_triangular():
    model = build(tiny())
    documents = torch.tensor([[0, 0, 1, 1, 1, 2]])
    causal = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    window2 = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    for window, expected in ((None, causal), (2, window2)):
        mask = Decoder.mask(model.position, 0, 6, 0, window, F64, torch.device("cpu"), documents=documents)
        assert mask is not None and mask.dtype == torch.bool
        assert mask.tolist() == [[expected]]


CASES = {
    "learned": {"position": {"kind": "learned"}},
    "sinusoidal": {"position": {"kind": "sinusoidal"}},
    "rope": {"position": {"kind": "rope"}, "attention": {"n_kv_head": 2}},
    "alibi": {"position": {"kind": "alibi"}},
    "rope, window 3": {"position": {"kind": "rope"}, "attention": {"window": 3}},
    "rope, chunk 3": {"position": {"kind": "rope"}, "attention": {"chunk": 3}},
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_packed_logits_equal_each_document_alone(overrides):
    """With document_mask and reset_positions, each document of a packed row is computed as it is alone."""
    model = build(tiny(**overrides))
    idx = packed()
    with torch.no_grad():
        logits = model(idx, **document_inputs(idx, EOS, reset_positions=True))
        for r, row in enumerate(ROWS):
            start = 0
            for doc in row:
                alone = model(torch.tensor([doc]))[0]
                torch.testing.assert_close(logits[r, start : start + len(doc)], alone, rtol=1e-12, atol=1e-12)
                start += len(doc)


def test_without_reset_positions_continue_across_documents():
    """Learned positions, masked but not reset: a document at offset s reads rows s, s+1... of the table,
    so it equals the document alone in a model whose table starts s rows further on."""
    model = build(tiny(position={"kind": "learned"}))
    idx = packed()
    weight = model.get_parameter("position.table.weight")
    table = weight.detach().clone()
    with torch.no_grad():
        logits = model(idx, **document_inputs(idx, EOS, reset_positions=False))
        for r, row in enumerate(ROWS):
            start = 0
            for doc in row:
                weight[: 16 - start] = table[start:]
                alone = model(torch.tensor([doc]))[0]
                weight.copy_(table)
                torch.testing.assert_close(logits[r, start : start + len(doc)], alone, rtol=1e-12, atol=1e-12)
                start += len(doc)
        assert not torch.allclose(logits[0, 4:10], model(torch.tensor([ROWS[0][1]]))[0])  # the offset matters


def test_training_module_passes_the_documents():
    cfg = tiny(position={"kind": "rope"})
    lit = LitModel(
        model=OmegaConf.to_container(OmegaConf.structured(cfg)),  # type: ignore[arg-type]
        optim={"name": "adamw", "lr": 1e-3},
        scheduler={"name": "constant"},
        documents={"eos_id": EOS, "reset_positions": True},
    )
    lit.configure_model()
    idx = packed()
    with torch.no_grad():
        expected = lit.decoder(
            idx, document_ids=document_ids(idx, EOS), position_ids=document_positions(document_ids(idx, EOS))
        )
        torch.testing.assert_close(lit(idx), expected, rtol=0, atol=0)
        assert not torch.allclose(lit(idx), lit.decoder(idx))


def write_shards(directory, meta=None):
    directory.mkdir()
    ids = np.asarray([i % 16 for i in range(200)], dtype="<u2")  # 15, the EOS, every 16th token
    ids.tofile(directory / "train.bin")
    ids[:60].tofile(directory / "val.bin")
    if meta is not None:
        (directory / "meta.json").write_text(json.dumps({"vocab_size": 16, "dtype": "uint16", **meta}))
    return str(directory)


def test_the_datamodule_reads_the_eos_and_refuses_what_cannot_work(tmp_path):
    with_eos, bare = write_shards(tmp_path / "eos", {"eos_id": EOS}), write_shards(tmp_path / "bare")
    raw = {"vocab_size": 16, "dtype": "uint16"}
    assert TokensDataModule(with_eos, seq_len=8, document_mask=True).documents == {
        "eos_id": EOS,
        "reset_positions": False,
    }
    assert TokensDataModule(bare, seq_len=8, document_mask=True, reset_positions=True, eos_id=3, **raw).documents == {
        "eos_id": 3,
        "reset_positions": True,
    }
    assert TokensDataModule(with_eos, seq_len=8).documents is None
    cases = [
        (dict(dir=bare, document_mask=True, **raw), "data.eos_id", "no eos_id"),
        (dict(dir=with_eos, document_mask=True, eos_id=3), "data.eos_id", "meta.json"),
        (dict(dir=bare, document_mask=True, eos_id=16, **raw), "data.eos_id", "[0, 16)"),
        (dict(dir=with_eos, reset_positions=True), "data.reset_positions", "document_mask=true"),
        (dict(dir=with_eos, document_mask="yes"), "data.document_mask", "true or false"),
    ]
    for kwargs, field, says in cases:
        with pytest.raises(ConfigError) as err:
            TokensDataModule(seq_len=8, **kwargs)
        assert err.value.field == field and says in str(err.value), str(err.value)


def test_the_model_refuses_documents_it_cannot_honour():
    model = build(tiny())
    idx = packed()
    with pytest.raises(ValueError, match="cached"):
        model(idx, model.new_cache(2), document_ids=document_ids(idx, EOS))


@pytest.mark.parametrize("layers", ["model/layers=none", "model/layers=mamba2_3_1"])
def test_a_run_trains_and_validates_within_documents(tmp_path, layers):
    """Two steps through ``train``: the run's val/loss is the exported model's loss over the validation
    windows with the documents masked and positions reset, not the loss without them; with a recurrent
    mixer (Mamba-2 layers beside attention) its state reset at each document."""
    shards = write_shards(tmp_path / "eos", {"eos_id": EOS})
    data = ["data=tokens", f"data.dir={shards}", "data.seq_len=16", "data.batch_size=4", "data.document_mask=true"]
    model = [
        layers,
        "model.n_layer=4",
        "model/position=rope",
        "model.d_model=32",
        "model.attention.n_head=2",
        "model.init_std=0.5",
    ]
    run = ["trainer.max_steps=2", "trainer.precision=32", "scheduler.warmup_steps=1", "trainer.val_check_interval=2"]
    cfg = compose(
        "train",
        [f"paths.output_dir={tmp_path / 'run'}", *data, "data.reset_positions=true", *model, *run]
        + ["logger=none", "callbacks.samples=null"],
        return_hydra_config=True,
    )
    summary = train(cfg)
    assert summary["data"]["documents"] == {"eos_id": EOS, "reset_positions": True}
    exported = load_weights(tmp_path / "run" / "model.safetensors").double()
    windows = ValidationWindows(np.fromfile(tmp_path / "eos" / "val.bin", dtype="<u2"), 16)
    inputs, targets = (torch.stack(t) for t in zip(*(windows[i] for i in range(len(windows)))))
    with torch.no_grad():
        masked = next_token_loss(exported(inputs, **document_inputs(inputs, EOS, reset_positions=True)), targets)
        plain = next_token_loss(exported(inputs), targets)
    logged = summary["metrics"]["final"]["val/loss"]
    assert logged == pytest.approx(float(masked), rel=1e-6) and logged != pytest.approx(float(plain), rel=1e-3)
