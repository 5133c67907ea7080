"""Convolutional and vision models in the whole-model path: the aten -> kit mappings of
convolutions (FLOPs against torch's own FlopCounterMode), batch/group norm, pooling,
upsampling and im2col (bytes counted by hand), torch.where's three inputs, and the zoo's
ResNet-50, VGG-16 and ViT-B/16 (torchvision's parameter counts, no unknown ops)."""
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from kit.cli import main
from kit.errors import KitError
from kit.ops import Elementwise
from kit.workload import zoo
from kit.workload.capture import capture
from kit.workload.kernels import Cheapest, Derived

torch.set_num_threads(1)
F32 = 4


class _Fn(nn.Module):
    """A module around one function, with an optional conv/norm layer in front."""

    def __init__(self, fn, layer=None):
        super().__init__()
        self.fn, self.layer = fn, layer

    def forward(self, x):
        return self.fn(self.layer(x) if self.layer is not None else x)


def _nodes(graph, name, phase=None):
    return [n for n in graph.kernels() if n.name() == name and (phase is None or n.phase == phase)]


def _one(graph, name, phase=None):
    found = _nodes(graph, name, phase)
    assert len(found) == 1, [(n.phase, n.name()) for n in graph.kernels()]
    return found[0]


def _copy_bytes(nbytes):
    """What memory_bound(nbytes) moves: a copy rounded up to whole fp32 elements."""
    return pytest.approx(nbytes, abs=2 * F32)


# -- convolutions --------------------------------------------------------------------------------
def _reference_flops(layer, x_shape, input_grad=True):
    x = torch.empty(x_shape, device="meta", requires_grad=input_grad)
    layer = layer.to("meta")
    with FlopCounterMode(display=False) as counter:
        y = layer(x)
        y.backward(torch.empty_like(y))
    counts = counter.get_flop_counts()["Global"]
    return {str(k).split(".")[-1].split("'")[0]: v for k, v in counts.items()}


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv2d(8, 16, 3, padding=1, bias=False), (2, 8, 32, 32)),
    (nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), (2, 8, 32, 32)),
    (nn.Conv2d(16, 32, 1, stride=2, bias=False), (2, 16, 14, 14)),
    (nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, bias=False), (2, 16, 16, 16)),
])
def test_conv_flops_match_torchs_flop_counter(layer, shape):
    ref = _reference_flops(layer, shape)
    # a 1x1 conv in front, so the layer's input needs a gradient: its backward is dx and dw
    model = nn.Sequential(nn.Conv2d(shape[1], shape[1], 1, bias=False), layer)
    g = capture(model, (torch.zeros(shape),), mode="train")
    fwd = [n for n in _nodes(g, "convolution", "fwd") if n.module == "1"]
    bwd = [n for n in _nodes(g, "convolution_backward", "bwd") if n.module == "1"]
    assert len(fwd) == len(bwd) == 1
    fwd, bwd = fwd[0], bwd[0]
    assert fwd.op.flops == ref["convolution"]
    assert bwd.op.flops == pytest.approx(ref["convolution_backward"], rel=0.02)
    assert bwd.kernels == 2


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv2d(8, 16, 3), (0, 8, 16, 16)),  # an empty batch
    (nn.Conv2d(8, 0, 3), (2, 8, 16, 16)),  # no output channels
    (nn.Conv2d(8, 0, 3, groups=4), (2, 8, 16, 16)),
    (nn.Conv2d(0, 4, 3), (2, 0, 16, 16)),  # no input channels
    (nn.ConvTranspose2d(8, 4, 2, stride=2), (0, 8, 4, 4)),
])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_an_empty_conv_is_a_kit_error_like_an_empty_linear(layer, shape, mode):
    """The implicit GEMM's sizes had been clamped to 1: a conv of no output channels was costed
    as 56,448 FLOPs (a 392 x 1 x 72 GEMM) and one of an empty batch as 2,304, where a Linear of
    an empty batch is a KitError ("m must be a positive whole number")."""
    with pytest.raises(KitError, match="convolution .*zero-size"):
        capture(layer, (torch.zeros(shape),), mode=mode)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_an_op_the_kit_refuses_names_the_module_it_ran_in(mode):
    """A refused op (here an empty conv deep in a model) says which module ran it, as a failing
    forward does: the message had named only the tensors' shapes."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.ReLU(), nn.Conv2d(8, 0, 3)))
    with pytest.raises(KitError, match=r"zero-size .*\(in module '1\.1'\)$"):
        capture(model, (torch.zeros(1, 3, 16, 16),), mode=mode)


def test_first_conv_backward_skips_the_input_gradient_and_counts_the_bias():
    layer = nn.Conv2d(3, 8, 3, padding=1)  # with bias, on an input that needs no gradient
    g = capture(layer, (torch.zeros(2, 3, 16, 16),), mode="train")
    op = _one(g, "convolution_backward", "bwd").op
    w_grad_flops = 2 * 8 * 3 * 9 * 2 * 16 * 16
    # a 3x3 conv's dw may run as its GEMM (the first option, reported) or as Winograd
    op = op.options[0] if isinstance(op, Cheapest) else op
    assert isinstance(op, Derived) and len(op.parts) == 2  # dw and the bias reduction
    assert op.flops == w_grad_flops
    assert op.parts[1].bytes == _copy_bytes(2 * 8 * 16 * 16 * F32)  # reads grad once


def test_grouped_conv_reads_every_groups_weights_and_its_backward_does_twice_the_work():
    layer = nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)
    model = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), layer)
    g = capture(model, (torch.zeros(2, 16, 8, 8),), mode="train")
    fwd = [n.op for n in _nodes(g, "convolution", "fwd") if n.module == "1"][0]
    bwd = [n.op for n in _nodes(g, "convolution_backward", "bwd") if n.module == "1"][0]
    macs = 2 * 64 * 32 * (16 // 4) * 9  # N·Ho·Wo·Cout·(Cin/groups)·k² (by hand)
    assert fwd.flops == 2 * macs and bwd.flops == 2 * 2 * macs  # dx and dw
    x, w, y = 2 * 16 * 64, 32 * 4 * 9, 2 * 32 * 64
    # implicit im2col reads each input pixel once per kernel tap; the weights of all 4 groups
    assert fwd.bytes == F32 * (x * 9 + w + y)


# -- batch norm, group norm ----------------------------------------------------------------------
def test_batch_norm_training_reads_x_twice_and_inference_once():
    x_shape, c = (4, 8, 16, 16), 8
    numel = 4 * 8 * 16 * 16
    params = (2 + 2) * c * F32  # weight, bias, running mean, running var
    train = capture(nn.BatchNorm2d(c), (torch.zeros(x_shape),), mode="train")
    fwd = _one(train, "native_batch_norm", "fwd")
    assert fwd.op_class == "batchnorm" and fwd.kernels == 2
    assert fwd.op.bytes == _copy_bytes(3 * numel * F32 + params)
    assert fwd.op.flops == 0  # memory-bound: costed as the copy of its bytes
    bwd = _one(train, "native_batch_norm_backward", "bwd")
    assert bwd.op.bytes == _copy_bytes(5 * numel * F32)  # dy, x; dy, x read again, dx written
    inf = capture(nn.BatchNorm2d(c), (torch.zeros(x_shape),), mode="inference")
    node = [n for n in inf.kernels() if n.op_class == "batchnorm"]
    assert len(node) == 1 and node[0].kernels == 1
    assert node[0].op.bytes == _copy_bytes(2 * numel * F32 + params)
    assert not train.unknown_ops() and not inf.unknown_ops()


def test_group_norm_is_a_groupnorm_kernel_both_ways():
    g = capture(nn.GroupNorm(4, 16), (torch.zeros(2, 16, 8, 8),), mode="train")
    numel = 2 * 16 * 64
    fwd, bwd = _one(g, "native_group_norm", "fwd"), _one(g, "native_group_norm_backward", "bwd")
    assert fwd.op_class == bwd.op_class == "groupnorm"
    assert fwd.op.bytes == _copy_bytes(3 * numel * F32 + 2 * 16 * F32)
    assert bwd.op.bytes == _copy_bytes(5 * numel * F32)
    assert not g.unknown_ops()


# -- pooling, upsampling, im2col ------------------------------------------------------------------
def test_max_pool_moves_input_output_and_indices_and_its_backward_skips_the_input():
    x_shape, y_numel = (2, 4, 16, 16), 2 * 4 * 8 * 8
    x_numel = 2 * 4 * 16 * 16
    g = capture(_Fn(lambda x: F.max_pool2d(x, 3, 2, 1), nn.Conv2d(4, 4, 1)),
                (torch.zeros(x_shape),), mode="train")
    fwd = _one(g, "max_pool2d_with_indices", "fwd")
    assert fwd.op_class == "pooling"
    assert fwd.op.bytes == _copy_bytes(x_numel * F32 + y_numel * (F32 + 8))  # int64 indices
    bwd = _one(g, "max_pool2d_with_indices_backward", "bwd")
    assert bwd.op.bytes == _copy_bytes(y_numel * (F32 + 8) + x_numel * F32)  # dy, indices; dx
    assert not g.unknown_ops()


@pytest.mark.parametrize("fn, fwd_name", [
    (lambda x: F.avg_pool2d(x, 2), "avg_pool2d"),
    (lambda x: F.adaptive_avg_pool2d(x, (4, 4)), "_adaptive_avg_pool2d"),
    (lambda x: F.interpolate(x, scale_factor=0.5, mode="nearest"), "upsample_nearest2d"),
])
def test_pooling_and_resampling_read_input_write_output(fn, fwd_name):
    g = capture(_Fn(fn, nn.Conv2d(4, 4, 1)), (torch.zeros(2, 4, 8, 8),), mode="train")
    x, y = 2 * 4 * 64 * F32, 2 * 4 * 16 * F32
    assert _one(g, fwd_name, "fwd").op.bytes == _copy_bytes(x + y)
    assert _one(g, fwd_name + "_backward", "bwd").op.bytes == _copy_bytes(y + x)
    assert not g.unknown_ops()


def test_upsample_bilinear_and_im2col_are_known():
    g = capture(_Fn(lambda x: F.unfold(F.interpolate(x, scale_factor=2, mode="bilinear"), 3),
                    nn.Conv2d(2, 2, 1)), (torch.zeros(1, 2, 4, 4),), mode="train")
    assert not g.unknown_ops(), g.unknown_ops()
    cols = _one(g, "im2col", "fwd")
    assert cols.op.bytes == _copy_bytes((1 * 2 * 64 + 1 * 2 * 9 * 36) * F32)


def test_the_deterministic_upsample_is_known_too():
    """With deterministic algorithms on (kit.predict.training.train_bundle turns them on for the
    process), torch runs the bilinear upsample as _unsafe_index gathers and its backward as
    _unsafe_index_put scatters: known either way."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        g = capture(_Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), nn.Conv2d(2, 2, 1)),
                    (torch.zeros(1, 2, 4, 4),), mode="train")
    finally:
        torch.use_deterministic_algorithms(before)
    assert _nodes(g, "_unsafe_index") and _nodes(g, "_unsafe_index_put")
    assert not g.unknown_ops(), g.unknown_ops()


# -- torch.where ---------------------------------------------------------------------------------
def test_where_reads_three_tensors():
    assert Elementwise("where", 1000).n_inputs == 3
    assert Elementwise("where", 1000).bytes == 1000 * F32 * 4  # cond, a, b; write y
    assert Elementwise("add", 1000).n_inputs == 2 and Elementwise("relu", 1000).n_inputs == 1
    n = 4096
    g = capture(_Fn(lambda x: torch.where(x > 0, x, x * 2)), (torch.zeros(n),), mode="inference")
    # a bool condition (1 byte), two fp32 operands, one fp32 output
    assert _one(g, "where").op.bytes == pytest.approx(n * (1 + F32 + F32 + F32))


# -- the zoo -------------------------------------------------------------------------------------
def _count(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("name, params", [
    ("resnet50", 25_557_032), ("vgg16", 138_357_544), ("vit-b16", 86_567_656)])
def test_vision_zoo_matches_torchvisions_parameter_counts(name, params):
    assert _count(zoo.build(name)) == params  # torchvision.models.<name>().parameters()


@pytest.mark.parametrize("name", ["resnet50", "vgg16", "vit-b16"])
@pytest.mark.parametrize("mode", ["train", "inference"])
def test_vision_zoo_has_no_unknown_ops(name, mode):
    g = zoo.graph_for(name, batch=2, mode=mode, disk=False)
    assert not g.unknown_ops(), g.unknown_ops()
    classes = g.op_classes()
    if name != "vit-b16":
        assert classes["pooling"] >= 1
    if name == "resnet50":
        assert classes["batchnorm"] == 53 * (2 if mode == "train" else 1)
    if mode == "train":  # the loss and its backward are in the step
        assert _nodes(g, "nll_loss_forward") and _nodes(g, "nll_loss_backward")
    assert g.meta["seq"] is None


def test_resnet50_forward_flops_are_the_papers():
    """He et al. 2016, Table 1: 3.8e9 multiply-adds per 224x224 image (torchvision's v1.5
    puts the stride on the 3x3 conv, 4.1e9)."""
    g = zoo.graph_for("resnet50", batch=1, mode="inference", disk=False)
    macs = sum(n.op.flops for n in g.kernels() if n.op_class == "gemm") / 2
    assert macs == pytest.approx(4.1e9, rel=0.02)


def test_predict_resnet50_on_the_cli(capsys):
    assert main(["predict", "resnet50", "--gpu", "a100-pcie-80gb", "--batch", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    classes = {c["op_class"]: c["share"] for c in r["by_class"]}
    assert not r.get("unknown_ops") and r["seq"] is None
    assert classes["gemm"] > 0.5 and "batchnorm" in classes and "pooling" in classes
    assert r["phases_ms"]["bwd"] > r["phases_ms"]["fwd"] > 0
    assert r["image_size"] == zoo.config("resnet50")["image_size"]  # the images, in place of a seq
    assert main(["predict", "resnet50", "--gpu", "a100-pcie-80gb", "--batch", "4"]) == 0
    size = r["image_size"]
    assert f"batch 4, images {size}x{size}, fp32" in capsys.readouterr().out.splitlines()[0]
    assert main(["predict", "gpt2", "--gpu", "t4", "--seq", "32", "--json"]) == 0
    assert "image_size" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["predict", "resnet50", "--gpu", "t4", "--seq", "128"], "reads no sequence"),
])
def test_vision_cli_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("change, message", [
    ({"image_size": 0}, "image_size must be a positive whole number"),
    ({"image_size": "big"}, "image_size must be a positive whole number"),
    ({"depths": [3, 0, 6, 3]}, "depths must be a list of positive whole numbers"),
])
def test_bad_resnet_config_is_a_kit_error(change, message):
    with pytest.raises(KitError, match=message):
        zoo.graph_for({**zoo.config("resnet50"), **change}, batch=1, mode="inference", disk=False)


def test_vit_image_must_split_into_patches():
    with pytest.raises(KitError, match="multiple of patch_size"):
        zoo.build({**zoo.config("vit-b16"), "image_size": 100})


# -- Winograd: the fastest of the implicit GEMM and F(4x4, 3x3) ---------------------------------
def _conv_node(layer, shape):
    g = capture(_Fn(lambda x: x, layer), (torch.zeros(shape),), mode="inference")
    return _one(g, "convolution", "fwd")


def test_a_plain_3x3_conv_may_run_as_winograd_others_may_not():
    from kit.ops import Gemm
    from kit.workload.kernels import Cheapest, leaf_options

    n3 = _conv_node(nn.Conv2d(64, 128, 3, padding=1, bias=False), (2, 64, 30, 30))
    assert isinstance(n3.op, Cheapest) and len(leaf_options(n3.op)) == 2
    implicit, wino = n3.op.options
    assert isinstance(implicit, Gemm) and n3.op.flops == implicit.flops  # reports the direct conv
    gemm = next(p for p in wino.parts if isinstance(p, Gemm))
    tiles = 2 * 8 * 8  # ceil(30 / 4) ** 2 output tiles of 4x4 per image
    assert (gemm.b, gemm.m, gemm.n, gemm.k) == (36, tiles, 128, 64)
    assert 36 * tiles * 64 * 128 < implicit.flops / 2  # 36 multiplies per tile, not 16 x 9
    for layer in (nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False),
                  nn.Conv2d(64, 128, 1, bias=False),
                  nn.Conv2d(64, 128, 3, padding=2, dilation=2, bias=False)):
        assert isinstance(_conv_node(layer, (2, 64, 30, 30)).op, Gemm), layer
    # a grouped 3x3 conv runs its per-group GEMM, bounded by the dense conv of its channels
    # (implicit GEMM or Winograd over the block-diagonal weight)
    grouped = _conv_node(nn.Conv2d(64, 128, 3, padding=1, groups=2, bias=False), (2, 64, 30, 30)).op
    assert isinstance(grouped.options[0], Gemm) and grouped.options[0].b == 2


def test_a_conv_costs_its_fastest_way():
    from kit.predict import get_predictor
    from kit.workload.iteration import isolated_latencies

    op = _conv_node(nn.Conv2d(256, 256, 3, padding=1, bias=False), (16, 256, 28, 28)).op
    model = get_predictor("tile")
    each = [isolated_latencies([o], "v100-pcie-32gb", model)[0, 0] for o in op.options]
    both = isolated_latencies([op], "v100-pcie-32gb", model)[0]
    assert both[0] == pytest.approx(min(each)) and both[1] <= both[0] <= both[2]


def test_fastest_option_sums_each_option_then_takes_the_least():
    import numpy as np

    from kit.workload.kernel_times import _fastest_option

    # node 0: option 0 = 3 + 4, option 1 = 5 -> 5; node 1: one option of 2; node 2: no leaves
    vals = np.array([[3.0, 1, 4, 0], [4.0, 1, 4, 0], [5.0, 2, 6, 1], [2.0, 1, 3, 0]])
    out = _fastest_option(vals, np.array([0, 0, 0, 1]), np.array([0, 0, 1, 0]), 3)
    assert out.tolist() == [[5.0, 2, 6, 1], [2.0, 1, 3, 0], [0.0, 0, 0, 0]]


def test_tf32_reaches_every_way_to_run_a_conv():
    from kit.ops import Gemm
    from kit.workload.capture import _as_tf32

    node = _conv_node(nn.Conv2d(16, 16, 3, padding=1, bias=False), (1, 16, 8, 8))
    tf = _as_tf32(node).op
    gemms = [tf.options[0]] + [p for p in tf.options[1].parts if isinstance(p, Gemm)]
    assert [g.dtype for g in gemms] == ["tf32", "tf32"]
    assert all(p.dtype == "fp32" for p in tf.options[1].parts if not isinstance(p, Gemm))
