"""A new user's multi-GPU walkthrough: tensor parallelism never beats a linear speed-up, a config
file works with --system, the API and the CLI give the same numbers, and options that would change
nothing are refused, not dropped."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from kit.api import predict_multi_gpu
from kit.cli import main
from kit.errors import KitError

NEUSIGHT = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "neusight"))
GPT2_MED = NEUSIGHT / "data" / "DLmodel_configs" / "gpt2_med.json"


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("model", ["gpt2", "bert-base"])
def test_tensor_parallelism_is_never_faster_than_linear(model):
    # GPT-2's 50,257-wide LM head had stayed unaligned at tp 1 (cuBLAS's legacy kernels in bf16)
    # while tp 2 padded the vocabulary as Megatron does: tp 2's compute came out under half of
    # tp 1's (gpt2 bf16, batch 8: 146.6 ms at tp 1, 63.3 ms of compute at tp 2)
    kw = dict(micro_batch=8, dtype="bf16", seq=512, graph=True)
    one = predict_multi_gpu(model, "dgx-a100", tp=1, **kw)["breakdown"]["compute"]
    two = predict_multi_gpu(model, "dgx-a100", tp=2, **kw)["breakdown"]["compute"]
    assert two >= one / 2, (one, two)


def test_tp1_pads_the_vocabulary_as_tp2_does():
    from kit.parallel.gpt import padded_vocab
    from kit.parallel.opgraph import _Sharder
    from kit.ops import EmbeddingBag, Gemm

    class _Graph:
        nodes = []

    class _Node:
        def __init__(self, module, phase):
            self.module, self.phase = module, phase

    sharder = _Sharder(_Graph(), 1, 50257)
    head = Gemm(m=4096, n=50257, k=768, dtype="bf16", kind="linear", shared_rhs=True, align=1)
    padded = sharder._padded(_Node("lm_head", "fwd"), head)
    assert padded.n == padded_vocab(50257, 1) == 50304 and padded.align == 8
    data = Gemm(m=4096, n=768, k=50257, dtype="bf16", kind="linear", shared_rhs=True, align=1)
    assert sharder._padded(_Node("lm_head", "bwd"), data).k == 50304
    weight = Gemm(m=50257, n=768, k=4096, dtype="bf16", kind="linear", shared_rhs=True, align=1)
    assert sharder._padded(_Node("lm_head", "bwd"), weight).m == 50304
    lookup = EmbeddingBag(rows=50257, dim=768, batch=8, pooling=1)
    assert sharder._padded(_Node("wte", "fwd"), lookup).rows == 50304
    other = Gemm(m=4096, n=3072, k=768, dtype="bf16", kind="linear", shared_rhs=True)
    assert sharder._padded(_Node("mlp", "fwd"), other) is other
    # as many tokens as the vocabulary, in another module: not the head, not padded
    tokens = Gemm(m=50257, n=3072, k=768, dtype="bf16", kind="linear", shared_rhs=True)
    assert sharder._padded(_Node("mlp", "fwd"), tokens) is tokens
    assert sharder._padded(_Node("mlp", "bwd"), replace(tokens, m=3072, n=768, k=50257)).k == 50257


@pytest.mark.skipif(not GPT2_MED.is_file(), reason="NeuSight's model configs absent")
def test_a_config_file_runs_on_a_system_as_its_zoo_twin(capsys):
    rc, out, err = _run(capsys, "predict", str(GPT2_MED), "--system", "dgx-a100", "--dp", "2", "--batch", "2", "--json")
    assert rc == 0, err
    cfg = json.loads(out)
    rc, out, err = _run(capsys, "predict", "gpt2-medium", "--system", "dgx-a100", "--dp", "2", "--batch", "2",
                        "--seq", "512", "--kernels", "analytic", "--json")
    assert rc == 0, err
    zoo = json.loads(out)
    assert cfg["iteration_ms"] == pytest.approx(zoo["iteration_ms"])
    rc, _, err = _run(capsys, "predict", str(GPT2_MED), "--system", "dgx-a100", "--kernels", "graph")
    assert rc == 2 and "config file" in err and "Traceback" not in err
    rc, _, err = _run(capsys, "predict", "/no/such/cfg.json", "--system", "dgx-a100")
    assert rc == 2 and "not found" in err


def test_a_config_file_without_a_vocabulary_is_refused(tmp_path, capsys):
    cfg = {"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, "n_positions": 128}
    path = tmp_path / "novocab.json"
    path.write_text(json.dumps(cfg))
    rc, _, err = _run(capsys, "predict", str(path), "--system", "dgx-a100")
    assert rc == 2 and "has no vocab_size" in err  # it had taken GPT-2's 50,257 without a word
    path.write_text(json.dumps({**cfg, "vocab_size": 1000}))
    rc, out, err = _run(capsys, "predict", str(path), "--system", "dgx-a100", "--json")
    assert rc == 0, err
    for bad in (0, "abc", 1.5):  # 0 had given a message about generated tokens, "abc" no limit at all
        path.write_text(json.dumps({**cfg, "vocab_size": 1000, "n_positions": bad}))
        rc, _, err = _run(capsys, "predict", str(path), "--system", "dgx-a100", "--seq", "64")
        assert rc == 2 and "n_positions must be a positive whole number" in err, err


def test_an_inline_shape_takes_its_seq_once():
    shape = "gpt:layers=2,hidden=256,heads=4,seq=64,vocab=1000"
    with pytest.raises(KitError, match="give it once"):
        predict_multi_gpu(shape, "dgx-a100", seq=128)
    assert predict_multi_gpu(shape, "dgx-a100")["iteration_ms"] == pytest.approx(
        predict_multi_gpu(shape, "dgx-a100", seq=64)["iteration_ms"])  # the same seq twice is one


def test_the_api_and_the_cli_agree(capsys):
    kw = dict(dp=8, micro_batch=4, global_batch=32)
    api = predict_multi_gpu("gpt2", "dgx-a100", **kw)["iteration_ms"]
    rc, out, err = _run(capsys, "predict", "gpt2", "--system", "dgx-a100", "--dp", "8", "--micro-batch", "4",
                        "--global-batch", "32", "--json")
    assert rc == 0, err
    assert api == pytest.approx(json.loads(out)["iteration_ms"])  # fp32 both (the API had taken fp16)
    short = predict_multi_gpu("gpt2", "dgx-a100", seq=512, **kw)["iteration_ms"]
    assert short < api
    with pytest.raises(KitError, match="seq must be a positive whole number"):
        predict_multi_gpu("gpt2", "dgx-a100", seq=0, **kw)


@pytest.mark.parametrize("argv, words", [
    (["--pp", "2", "--schedule", "interleaved"], "needs --virtual-stages"),
    (["--sequence-parallel"], "with tp 1 it changes nothing"),
])
def test_options_that_change_nothing_are_refused(capsys, argv, words):
    rc, _, err = _run(capsys, "predict", "gpt2", "--system", "dgx-a100", *argv)
    assert rc == 2 and words in err and "Traceback" not in err


def test_moe_keys_on_a_dense_shape_are_refused(capsys):
    for key in ("topk=3", "moe_every=2"):
        rc, _, err = _run(capsys, "predict", f"gpt:layers=4,hidden=512,heads=8,{key}", "--system", "dgx-a100")
        assert rc == 2 and "applies to experts" in err, err
    rc, _, err = _run(capsys, "predict", "moe:layers=4,hidden=512,heads=8,experts=4,topk=3", "--system", "dgx-a100")
    assert rc == 0, err
