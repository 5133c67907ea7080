"""A language model's training step ends its forward pass with the loss: the logits upcast to
fp32, log-softmax and NLL over the vocabulary, and their backward. It used to start the backward
at the logits (no loss at all), which is what NeuSight's labels measure, so kit validate keeps
that (loss=False)."""
import json

import pytest
import torch

from kit.api import predict_model
from kit.cli import main
from kit.workload import zoo

torch.set_num_threads(1)
TINY = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 100,
        "n_positions": 16}
LOSS_OPS = {("fwd", "aten._to_copy.default"), ("fwd", "aten._log_softmax.default"),
            ("fwd", "aten.nll_loss_forward.default"), ("bwd", "aten.nll_loss_backward.default"),
            ("bwd", "aten._log_softmax_backward_data.default"), ("bwd", "aten._to_copy.default")}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _loss_nodes(g):
    return {(n.phase, n.aten) for n in g if n.module == "loss" and n.op is not None}


def test_training_step_has_the_cross_entropy_over_the_vocabulary():
    g = zoo.graph_for(TINY, batch=2, seq=8, mode="train", dtype="bf16", disk=False)
    assert g.meta["loss"] == "cross-entropy" and _loss_nodes(g) == LOSS_OPS
    (ls,) = [n.op for n in g if n.aten == "aten._log_softmax.default"]
    assert (ls.rows, ls.cols, ls.dtype) == (2 * 8, 100, "fp32")  # over the upcast logits
    # the loss is in the forward pass: the backward starts from it (the seed gradient, then NLL)
    bwd = [n.aten for n in g.kernels() if n.phase == "bwd"]
    assert bwd[:2] == ["aten.ones_like.default", "aten.nll_loss_backward.default"]
    plain = zoo.graph_for(TINY, batch=2, seq=8, mode="train", dtype="bf16", disk=False, loss=False)
    assert plain.meta["loss"] is None and not _loss_nodes(plain)
    assert len(g) > len(plain)


def test_no_loss_in_inference_or_for_a_model_without_a_vocabulary():
    inf = zoo.graph_for(TINY, batch=2, seq=8, mode="inference", disk=False)
    assert not _loss_nodes(inf) and not inf.meta.get("loss")
    dlrm = zoo.graph_for("dlrm", batch=4, mode="train", disk=False)
    assert not _loss_nodes(dlrm)


def test_the_loss_costs_time_and_no_loss_is_the_old_step():
    with_loss = predict_model(TINY, "h100-sxm", mode="train", batch=4, seq=16, dtype="bf16")
    without = predict_model(TINY, "h100-sxm", mode="train", batch=4, seq=16, dtype="bf16", loss=False)
    assert with_loss.total_ms > without.total_ms
    assert with_loss.to_dict()["loss"] == "cross-entropy" and without.to_dict()["loss"] is None


def test_cli_no_loss_and_where_it_does_not_belong(capsys, tmp_path):
    assert main(["predict", "gpt2", "--gpu", "t4", "--batch", "1", "--seq", "8"]) == 0
    assert "the forward ends with the loss" in capsys.readouterr().out
    assert main(["predict", "gpt2", "--gpu", "t4", "--batch", "1", "--seq", "8", "--no-loss"]) == 0
    assert "loss" not in capsys.readouterr().out
    assert main(["predict", "gpt2", "--gpu", "t4", "--mode", "inference", "--no-loss"]) == 2
    assert "--no-loss goes with --mode train" in capsys.readouterr().err


def test_validate_predicts_neusights_labels_without_the_loss(capsys, tmp_path):
    d = tmp_path / "labels" / "Tesla_T4"
    d.mkdir(parents=True)
    (d / "gpt2-train-8-1.json").write_text(json.dumps(
        {"num_layer": 12, "e2e_latency": 50.0, "fw_latency": 20.0, "bwall_latency": 30.0}))
    assert main(["validate", "--labels", str(tmp_path / "labels"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["configs"]
    ref = predict_model("gpt2", "t4", mode="train", batch=1, seq=8, loss=False).total_ms
    assert row["predicted_ms"] == pytest.approx(ref, rel=1e-9)


def test_compare_takes_no_loss_too(capsys):
    # kit compare shares kit predict's model arguments: --no-loss was accepted and ignored
    rows = {}
    for flag in ([], ["--no-loss"]):
        assert main(["compare", "gpt2", "--gpus", "t4", "--batch", "1", "--seq", "8", "--json", *flag]) == 0
        r = json.loads(capsys.readouterr().out)
        rows[bool(flag)] = r
    assert rows[False]["loss"] == "cross-entropy" and rows[True]["loss"] is None
    assert rows[False]["rows"][0]["step_ms"] > rows[True]["rows"][0]["step_ms"]
    assert main(["compare", "gpt2", "--gpus", "t4", "--mode", "inference", "--no-loss"]) == 2


TINY_RESNET = {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
               "num_channels": 3, "num_labels": 10, "image_size": 32}


def test_no_loss_is_refused_where_no_vocabulary_loss_was_there_to_leave_out(tmp_path, capsys):
    # resnet50's forward computes its own classifier cross-entropy, and the zoo adds the loss over
    # the vocabulary only to a model with a vocab_size: `kit predict resnet50 --no-loss` had
    # predicted the same step as without it, without a word
    from tests.cli_support import one_error_line

    with pytest.raises(Exception, match="has no vocabulary") as e:
        predict_model(TINY_RESNET, "h100-sxm", mode="train", batch=2, loss=False)
    assert type(e.value).__name__ == "KitError"
    config = tmp_path / "tiny_resnet.json"
    config.write_text(json.dumps(TINY_RESNET))
    for argv in (["predict", str(config), "--gpu", "h100-sxm", "--batch", "2", "--no-loss"],
                 ["compare", str(config), "--gpus", "h100-sxm,a100-sxm4-40gb", "--batch", "2", "--no-loss"]):
        line = one_error_line(capsys, argv)
        assert "--no-loss" in line and "tiny_resnet.json has no vocabulary" in line
    # a language model still takes it
    assert predict_model(TINY, "h100-sxm", mode="train", batch=2, seq=8, loss=False).total_ms > 0
