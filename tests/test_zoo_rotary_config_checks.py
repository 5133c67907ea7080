"""HF-style configs of the rotary (Llama-style) families: sizes that cannot build the model are
one KitError naming the field, before any capture."""
import pytest

from kit.errors import KitError
from kit.workload import zoo

TINY = {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2,  # (left out, HF MistralConfig's 8: more than the 4 query heads)
        "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("sizes", [{"head_dim": 7}, {"hidden_size": 60}])  # 7 and 60 / 4 = 15
def test_an_odd_head_is_named_not_blamed_on_the_inputs(sizes):
    with pytest.raises(KitError, match="head of (7|15) .* must be even") as e:
        zoo.graph_for({**TINY, **sizes}, 1, 16, "inference", disk=False)
    assert "inputs must match" not in str(e.value)


@pytest.mark.parametrize("window", [-4, 2.5, "4096", True])
def test_a_sliding_window_that_is_no_token_count_is_refused(window):
    with pytest.raises(KitError, match="sliding_window must be a whole number"):
        zoo.graph_for({**TINY, "sliding_window": window}, 1, 64, "inference", disk=False)


def test_no_window_and_a_real_window_still_build():
    """null and 0 mean no window (a causal prefill, no mask read); a window shorter than the
    prefill reads its mask."""
    for window in (None, 0):
        g = zoo.graph_for({**TINY, "sliding_window": window}, 1, 64, "inference", disk=False)
        assert all(n.op.causal and not n.op.mask_bytes for n in g if n.op_class == "attention")
    g = zoo.graph_for({**TINY, "sliding_window": 16}, 1, 64, "inference", disk=False)
    assert all(n.op.mask_bytes for n in g if n.op_class == "attention")
