"""Fourth bad-input audit (fuzzing every command and kit.api entry with bad values and option
combinations): each problem found is one KitError, never a traceback or a silently wrong number."""
import pytest

from kit import api
from kit.errors import KitError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))

TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
            "vocab_size": 128}


# -- 1. inputs= with a model the kit builds itself ---------------------------------------------
@pytest.mark.parametrize("model", ["gpt2", TINY_GPT])
def test_inputs_with_a_zoo_name_or_config_is_refused(model):
    """The kit makes a zoo model's or config's token ids from batch and seq: inputs of batch 8 and
    128 tokens had been dropped without a word, and gpt2 priced at batch 1, 1024 tokens."""
    import torch

    with pytest.raises(KitError, match="inputs= goes with an nn.Module"):
        api.predict_model(model, "h100-sxm", mode="inference",
                          inputs=(torch.zeros(8, 128, dtype=torch.long),))
