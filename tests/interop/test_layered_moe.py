"""What the mixture-of-experts families whose layers differ share (archlab/interop/families/layered_moe.py):
``shortest_layout``, the first layers and the repeated pattern a per-layer list reads as."""

from archlab.interop.families.layered_moe import shortest_layout


def test_shortest_layout():
    assert shortest_layout(["a", "b", "a", "b", "a"]) == ([], ["a", "b"])
    assert shortest_layout(["d", "d", "m", "m", "m"]) == (["d", "d"], ["m"])
    assert shortest_layout(["a", "b", "c"]) == ([], ["a", "b", "c"])
