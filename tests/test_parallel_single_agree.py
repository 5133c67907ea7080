"""A one-GPU layout of `kit predict --system` against `kit predict --gpu`: the same captured
kernels, costed the same way (in the stream, the learned predictor's isolated-kernel floor out),
so the step agrees phase by phase once Megatron's loss, which only the multi-GPU path adds, is
counted. Both sides are computed here; no expected number is written down."""
import pytest
import torch

from kit import ops
from kit.api import predict_model
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel import HostModel, Layout, parse_model, predict_parallel
from kit.parallel.build import build_iteration
from kit.parallel.costs import Coster
from kit.predict import get_predictor
from kit.workload.iteration import in_stream_ms, isolation_floor_ms

torch.set_num_threads(1)
SYSTEM = "dgx-a100"  # 8x A100-SXM4-40GB: one of its GPUs is --gpu a100-sxm4-40gb
# GPU-bound configurations (host costs, which the two paths model differently, hide): small
# kernels (gpt2, seq 128, where the floor is ~40% of the isolated time) and larger ones
CONFIGS = [("gpt2", 4, 128), ("gpt2", 2, 512)]


def _loss_ms(model: str, batch: int, seq: int, gpu) -> tuple[float, float]:
    """Megatron's loss as kit.parallel.opgraph adds it to a graph that ends at the logits (a
    softmax over the vocabulary forward, a multiply backward), costed in the stream."""
    vocab = parse_model(model, seq=seq).vocab
    tokens = batch * seq
    pred = get_predictor("tile")
    floor = isolation_floor_ms(pred, gpu)
    out = []
    for op in (ops.Softmax(tokens, vocab, "fp32"), ops.Elementwise("mul", tokens * vocab, "fp32", inputs=2)):
        row = pred.predict([op], gpu).iloc[0]
        out.append(float(in_stream_ms(row.latency_ms, row.roofline_ms, floor)))
    return out[0], out[1]


@pytest.mark.parametrize("model,batch,seq", CONFIGS)
def test_one_gpu_layout_agrees_with_single_gpu(model, batch, seq):
    gpu = get_system(SYSTEM).gpu
    single = predict_model(model, gpu.key, mode="train", batch=batch, seq=seq, predictor="tile",
                           loss=False)  # Megatron's loss is added below
    lay = Layout(micro_batch=batch, dtype="fp32", optimizer_step=False)
    multi = predict_parallel(parse_model(model, seq=seq), SYSTEM, lay, predictor="tile",
                             host=HostModel(), graph=True)
    assert multi["kernel_costing"]["in_stream"] is True
    loss_fwd, loss_bwd = _loss_ms(model, batch, seq, gpu)
    mb = multi["per_microbatch_ms"][0]
    for got, ref in ((mb["fwd_ms"], single.phases_ms["fwd"] + loss_fwd),
                     (mb["bwd_ms"], single.phases_ms["bwd"] + loss_bwd),
                     (multi["iteration_ms"], single.total_ms + loss_fwd + loss_bwd)):
        assert got == pytest.approx(ref, rel=0.03)


def test_isolated_times_are_what_made_them_disagree():
    """The same layout with the floor kept (the costing before the fix) is far off: the test
    above can tell the two costings apart."""
    model, batch, seq = CONFIGS[0]
    single = predict_model(model, get_system(SYSTEM).gpu.key, mode="train", batch=batch, seq=seq,
                           predictor="tile", loss=False)
    lay = Layout(micro_batch=batch, dtype="fp32", optimizer_step=False)
    iso = predict_parallel(parse_model(model, seq=seq), SYSTEM, lay, predictor="tile",
                           host=HostModel(), graph=True, in_stream=False)
    assert iso["kernel_costing"]["in_stream"] is False
    assert iso["iteration_ms"] > 1.3 * single.total_ms


def test_costing_follows_the_kernels_source():
    """Captured graph: in the stream; analytic layer: isolated (what it is validated with)."""
    lay = Layout(micro_batch=1, dtype="fp32", optimizer_step=False)
    spec = parse_model("gpt2", seq=128)
    graph = predict_parallel(spec, SYSTEM, lay, predictor="tile", graph=True)
    analytic = predict_parallel(spec, SYSTEM, lay, predictor="tile", graph=False)
    assert graph["kernel_costing"]["in_stream"] and not analytic["kernel_costing"]["in_stream"]
    assert graph["kernel_costing"]["isolation_floor_ms"] > 0
    assert analytic["kernel_costing"]["isolation_floor_ms"] == 0
    forced = predict_parallel(spec, SYSTEM, lay, predictor="tile", graph=False, in_stream=True)
    assert forced["iteration_ms"] < analytic["iteration_ms"]


def test_predictor_without_floor_costs_both_ways_alike():
    """The analytic wave model has no isolated-kernel floor: in_stream changes nothing."""
    lay = Layout(micro_batch=1, dtype="fp32", optimizer_step=False)
    spec = parse_model("gpt2", seq=128)
    a = predict_parallel(spec, SYSTEM, lay, predictor="wave", graph=False, in_stream=False)
    b = predict_parallel(spec, SYSTEM, lay, predictor="wave", graph=False, in_stream=True)
    assert a["iteration_ms"] == pytest.approx(b["iteration_ms"], rel=1e-12)


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_bad_in_stream_is_one_kit_error(bad):
    spec = parse_model("gpt:layers=2,hidden=256,heads=4,seq=64")
    lay = Layout(micro_batch=1)
    with pytest.raises(KitError, match="in_stream"):
        predict_parallel(spec, SYSTEM, lay, predictor="wave", in_stream=bad)
    with pytest.raises(KitError, match="in_stream"):
        build_iteration(spec, lay, get_system(SYSTEM), "wave", in_stream=bad)
    with pytest.raises(KitError, match="in_stream"):
        Coster(lay, get_system(SYSTEM), "wave", in_stream=bad)


def test_cli_says_how_kernels_were_costed(capsys):
    from kit.cli import main

    rc = main(["predict", "gpt2", "--system", SYSTEM, "--batch", "1", "--seq", "128",
               "--dtype", "fp32", "--predictor", "tile"])
    out = capsys.readouterr().out
    assert rc in (0, None)
    assert "kernel times: in the stream" in out and "kit predict --gpu" in out


def test_the_note_names_the_gradient_buffer_zeroing_with_the_step():
    """With the optimizer step a one-GPU layout also zeroes Megatron's main_grad buffer each
    iteration (kit.parallel.costs.grad_buffer_zero_ms), which `--gpu` does not: the note that
    lists what differs names it, and only when it is charged."""
    spec = parse_model("gpt2", seq=128)
    notes = {step: predict_parallel(spec, SYSTEM, Layout(micro_batch=1, dtype="fp32", optimizer_step=step),
                                    predictor="tile", graph=True)["kernel_costing"]["note"]
             for step in (True, False)}
    assert "gradient buffer" in notes[True] and "gradient buffer" not in notes[False]
