"""The sinusoidal table's layouts (``model.position.layout``, ``offset``, ``endpoint``): each equals the
table transformers builds for the family that uses it, fairseq's for XGLM (``XGLMSinusoidalPositionalEmbedding``,
sines then cosines, frequencies reaching 1/10000, two leading rows) and CTRL's (``positional_encoding``,
sines then cosines of Vaswani's frequencies); each changes the model's output; bad values are refused."""

import pytest
import torch
from helpers.parts import tiny

from archlab import ConfigError, count_params
from archlab.nn.positions import build_position
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")

T, D = 40, 32  # 40 positions, past the configs' context of 24: the table has no length


def table(**position) -> torch.Tensor:
    """The table archlab adds at positions 0..T-1 for ``position``'s fields (of a d_model of D)."""
    cfg = validate(tiny(position={"kind": "sinusoidal", **position}))
    return build_position(cfg).embed(torch.zeros(T, D), torch.arange(T))


def test_fairseq_layout_equals_xglm_s_table():
    """layout halves, offset 2, endpoint: XGLM's rows 2..T+1 (position p at row p + 2), to float32 rounding."""
    from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

    hf = XGLMSinusoidalPositionalEmbedding.get_embedding(T + 2, D)
    torch.testing.assert_close(table(layout="halves", offset=2, endpoint=True), hf[2:], rtol=0, atol=1e-5)


def test_halves_layout_equals_ctrl_s_table():
    from transformers.models.ctrl.modeling_ctrl import positional_encoding

    hf = positional_encoding(T, D, torch.float32)
    torch.testing.assert_close(table(layout="halves"), hf, rtol=0, atol=1e-5)


def test_each_field_changes_the_table_and_none_adds_parameters():
    """Each field set alone moves the default table (Vaswani's, interleaved) by more than rounding: the
    halves are the interleaved columns reordered, the offset shifts the rows, endpoint respaces the
    frequencies; none has parameters."""
    default = table()
    halves = table(layout="halves")
    torch.testing.assert_close(halves, torch.cat((default[:, 0::2], default[:, 1::2]), -1))
    torch.testing.assert_close(table(offset=2)[:-2], default[2:])
    assert (table(endpoint=True) - default).abs().max() > 1e-2
    assert (halves - default).abs().max() > 1e-2
    plain = count_params(tiny(position={"kind": "sinusoidal"}))
    assert (
        count_params(tiny(position={"kind": "sinusoidal", "layout": "halves", "offset": 2, "endpoint": True})) == plain
    )


@pytest.mark.parametrize(
    "position, d_model, field, said",
    [
        ({"layout": "sines"}, 32, "model.position.layout", "one of"),
        ({"offset": -1}, 32, "model.position.offset", "non-negative integer"),
        ({"endpoint": True}, 2, "model.d_model", "at least 4"),
    ],
)
def test_bad_values_are_refused_naming_the_field(position, d_model, field, said):
    cfg = tiny(d_model=d_model, attention={"n_head": 1, "n_kv_head": 1}, position={"kind": "sinusoidal", **position})
    with pytest.raises(ConfigError, match=said) as err:
        validate(cfg)
    assert err.value.field == field


def test_describe_names_the_fields_set():
    cfg = validate(tiny(position={"kind": "sinusoidal", "layout": "halves", "offset": 2, "endpoint": True}))
    assert build_position(cfg).describe(cfg) == "sinusoidal(halves,+2,endpoint)"
    assert build_position(cfg).describe(validate(tiny(position={"kind": "sinusoidal"}))) == "sinusoidal"
