"""archlab-report's figures at 24 variants, measured as drawn: legends outside every panel, no two tick labels
or panel titles overlapping, a distinct colour per key (the same in every panel), and a final-value figure
wide enough for its labels."""

from __future__ import annotations

import itertools

import pytest

from archlab.figures import colours, pyplot
from archlab.report.plots import Line, Point, final_figure, small_multiples

LRS = ["1e-3", "3e-3", "1e-2", "3e-2"]
VARIANTS = [
    ", ".join(v)
    for v in itertools.product(
        ("learned", "sinusoidal", "rope", "alibi"), ("gelu", "swiglu", "geglu"), ("layernorm", "rmsnorm")
    )
]


def boxes(artists, renderer):
    return [a.get_window_extent(renderer) for a in artists if a.get_visible() and a.get_text()]


def assert_apart(found, what):
    for a, b in itertools.combinations(found, 2):
        assert not a.overlaps(b), f"{what} overlap: {a} and {b}"


@pytest.fixture(scope="module")
def curves():
    lines = [
        Line(
            panel=v, key=lr, xs=[250.0, 500.0, 750.0, 1000.0], ys=[3.0 - k * 0.1 - j * 0.01 - s * 0.2 for s in range(4)]
        )
        for j, v in enumerate(VARIANTS)
        for k, lr in enumerate(LRS)
    ]
    fig = small_multiples(
        lines,
        title="val/loss during training; panels: position, mlp, norm",
        xlabel="step",
        ylabel="val/loss",
        key_title="optim.lr",
    )
    fig.canvas.draw()
    yield fig
    pyplot().close(fig)


def test_small_multiples_keep_the_legend_off_the_panels_and_the_labels_apart(curves):
    renderer = curves.canvas.get_renderer()
    panels = [ax for ax in curves.axes if ax.get_visible()]
    assert len(panels) == 24 and len(curves.legends) == 1
    legend = curves.legends[0].get_window_extent(renderer)
    for ax in panels:
        assert not legend.overlaps(ax.get_window_extent(renderer))
        assert_apart(boxes(ax.get_xticklabels(), renderer), "x tick labels")
        assert_apart(boxes(ax.get_yticklabels(), renderer), "y tick labels")
    assert_apart(boxes([ax.title for ax in panels], renderer), "panel titles")
    figure = curves.bbox
    assert figure.x0 <= legend.x0 and legend.x1 <= figure.x1  # the legend is inside the image


def test_each_learning_rate_has_one_colour_in_every_panel_and_no_two_share_one(curves):
    by_key: dict[str, set] = {}
    for ax in curves.axes:
        for line, lr in zip(ax.get_lines(), LRS):
            by_key.setdefault(lr, set()).add(tuple(line.get_color()))
    assert all(len(c) == 1 for c in by_key.values()) and len({c.pop() for c in by_key.values()}) == 4


@pytest.mark.parametrize("n", [3, 12, 30])
def test_colours_are_distinct_for_any_number_of_names(n):
    names = [f"variant {i}" for i in range(n)]
    assert len(set(colours(names).values())) == n


def test_the_final_figure_is_as_wide_as_its_labels_and_as_tall_as_its_rows():
    long = "sinusoidal, swiglu, layernorm, model.attention.n_kv_head=4"
    points = [
        Point(v if j else long, lr, 2.0 + k / 10, 0.02) for j, v in enumerate(VARIANTS) for k, lr in enumerate(LRS)
    ]
    fig = final_figure(points, title="final val/loss", xlabel="final val/loss", key_title="optim.lr")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    labels = boxes(ax.get_yticklabels(), renderer)
    assert len(labels) == 24 and min(b.x0 for b in labels) >= 0  # no label cut at the left edge
    assert_apart(labels, "row labels")
    assert ax.get_window_extent(renderer).width / fig.dpi > 3.5  # the plot keeps its width beside the labels
    assert not fig.legends[0].get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    assert fig.get_size_inches()[1] == pytest.approx(0.26 * 24 + 1.4)
    pyplot().close(fig)
