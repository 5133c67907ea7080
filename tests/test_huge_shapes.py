"""A batch or sequence past any GPU is one error line (exit 2) or a KitError, never torch's
overflow traceback from building the example inputs (it was a 40-line RuntimeError/TypeError)."""
import pytest

from kit import api
from kit.cli import main
from kit.errors import KitError
from kit.workload.zoo import MAX_TOKENS


@pytest.mark.parametrize("argv", [
    ["predict", "gpt2", "--gpu", "h100", "--batch", "1e16"],
    ["predict", "gpt2", "--gpu", "h100", "--batch", "9223372036854775807"],
    ["predict", "gpt2", "--gpu", "h100", "--mode", "decode", "--batch", "1e19", "--seq", "8"],
    ["predict", "gpt2", "--gpu", "h100", "--mode", "generate", "--batch", "1e30", "--new-tokens", "2",
     "--seq", "8"],
    ["predict", "resnet50", "--gpu", "h100", "--batch", "1e19"],
    ["predict", "dlrm", "--gpu", "h100", "--batch", "1e19"],
    ["compare", "gpt2", "--gpus", "h100,a100", "--batch", "1e19"],
])
def test_huge_shapes_are_one_line(capsys, argv):
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "more than any GPU holds" in err[0]


def test_the_bound_in_the_api_and_just_under_it():
    with pytest.raises(KitError, match="tokens a step"):
        api.predict_model("gpt2", "h100", batch=2**64)
    with pytest.raises(KitError, match="samples a step"):
        api.predict_model("dlrm", "h100", batch=MAX_TOKENS + 1, mode="inference")
    with pytest.raises(KitError, match="tokens a step"):
        api.predict_generation("gpt2", "h100", batch=2**64, prompt=8, new_tokens=2)


def test_a_decode_step_names_its_kv_cache_not_its_new_tokens(capsys):
    # a decode step computes `batch` new tokens; batch x context is its KV cache. At batch 1e12
    # the error had said "batch x seq 1,023 is 1.02e+15 tokens a step"
    assert main(["predict", "gpt2", "--gpu", "h100", "--mode", "decode", "--batch", "1e12"]) == 2
    err = capsys.readouterr().err
    assert "context 1,023" in err and "KV cache" in err and "tokens a step" not in err
    with pytest.raises(KitError, match="KV cache") as e:
        api.predict_model("gpt2", "h100", batch=2**40, seq=2, mode="decode")
    assert f"adds {2**40:,} new" in str(e.value)
    # a decode step of a model of one's own (its cache from decode_inputs) says the same
    with pytest.raises(KitError, match="KV cache"):
        api.predict_model({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2,
                           "vocab_size": 100}, "h100", batch=2**40, seq=8, mode="decode")


def test_a_module_with_a_huge_batch(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny_mod.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.e = torch.nn.Embedding(100, 8)\n"
        "    def forward(self, ids):\n"
        "        return self.e(ids).sum()\n"
        "def build():\n"
        "    return M()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["predict", "tiny_mod:build", "--gpu", "h100", "--batch", "1e19"]) == 2
    assert "more than any GPU holds" in capsys.readouterr().err


def test_api_option_combinations_the_cli_refuses():
    import numpy as np

    with pytest.raises(KitError, match="goes with mode 'train'"):
        api.predict_model("gpt2", "h100", mode="inference", loss=False)
    # numpy integers are whole numbers here as everywhere else in the API
    g = api.predict_generation("gpt2", "h100", batch=np.int64(1), prompt=np.int64(16),
                               new_tokens=np.int64(2))
    assert g["prompt"] == 16 and type(g["prompt"]) is int and g["new_tokens"] == 2


def test_an_empty_gpu_and_a_copy_without_a_ridge(capsys):
    assert main(["predict", "gpt2", "--gpu", ""]) == 2
    assert "--gpu is empty" in capsys.readouterr().err
    assert main(["op", "memcpy", "--direction", "h2d", "--bytes", "1e9", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "ridge" not in out and "work" in out


def test_decode_with_a_callers_inputs_says_what_it_counted_as_cache():
    # any floating input given with mode decode was counted as the KV cache without a word
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = api.predict_model(torch.nn.Linear(64, 64), "h100", inputs=(torch.zeros(4, 8, 64),),
                               mode="decode")
    notes = [str(w.message) for w in caught if "counted as its KV cache" in str(w.message)]
    assert len(notes) == 1 and "decode_inputs" in notes[0]
    assert it.meta["kv_cache_bytes"] == 4 * 8 * 64 * 4
