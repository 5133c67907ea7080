"""Costing fixes of the capture: a scalar operand is no input stream, a fill follows
TensorIterator's vectorization rule, an 8-byte element is one pass over twice the words, an out=
tensor is written and not read, and a GEMM operand cuBLAS cannot take is copied contiguous."""
import pytest
import torch

from kit.workload.capture import capture
from kit.workload.kernels import leaf_ops
from kit.workload.mapping import map_op

N = 64 * 1024


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def kernels(model, *inputs):
    return [n for n in capture(model, inputs, mode="inference") if n.op is not None]


def leaf(op):
    (part, _), = leaf_ops(op)
    return part


class Compare(torch.nn.Module):
    def forward(self, x):
        return x > 0.5, x.gt(torch.tensor(0.5)), x * torch.tensor(2.0, device=x.device)


def test_a_scalar_operand_is_no_input_stream():
    # one fp32 read of x and the output's write: the Python scalar, the 0-dim CPU tensor and the
    # 0-dim device tensor add 0 bytes (the device one only sends the loop to the generic kernel)
    gt, gt_cpu, mul = kernels(Compare(), torch.empty(64, 1024))
    assert gt.op.bytes == gt_cpu.op.bytes == N * (4 + 1)
    assert mul.op.bytes == N * (4 + 4) and not leaf(mul.op).vectorized


def test_a_fill_of_a_strided_view_takes_the_generic_loop():
    y = meta(64, 1024)
    op, _, _ = map_op("fill_", (y[:, ::2], 0.0), {}, y[:, ::2])
    assert not leaf(op).vectorized
    op, _, _ = map_op("zero_", (y.t(),), {}, y.t())  # a transpose is dense: vectorized
    assert leaf(op).vectorized
    op, _, _ = map_op("fill_", (y, meta(())), {}, y)  # fill_(Tensor) on the device: copy_(value)
    assert not leaf(op).vectorized
    assert leaf(map_op("zeros_like", (y[:, ::2],), {}, meta(64, 512))[0]).vectorized


def test_an_8_byte_element_is_one_pass_over_twice_the_words():
    """The learned predictors see an 8-byte op as one pass over 2 fp32 words an element, not as
    two passes (which would carry two kernels' fixed costs); the bytes are the op's own."""
    x, bias = meta(64, 1024, dtype=torch.float64), meta(1024, dtype=torch.float64)
    op, _, _ = map_op("add", (x, bias), {}, x)
    (_, scale), = leaf_ops(op)
    assert scale < 1.5  # one pass (a bias read a little extra), not two
    assert leaf(op).numel == 2 * N and not leaf(op).vectorized
    assert op.bytes == pytest.approx(N * 8 * 2 + 1024 * 8)  # x read, y written, the bias once
    ids = meta(64, 1024, dtype=torch.int64)
    op, _, _ = map_op("add", (ids, 1), {}, ids)
    assert leaf(op).numel == 2 * N and op.bytes == N * 8 * 2


class Into(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        torch.add(x, x, out=out)
        torch.neg(x, out=out)
        torch.sum(x, 0, out=out[0])
        return out


def test_an_out_tensor_is_written_not_read():
    add, neg, total = kernels(Into(), torch.empty(64, 1024))
    assert add.op.bytes == N * 4 * 3  # x read twice, out written
    assert neg.op.bytes == N * 4 * 2
    assert total.op.bytes == N * 4 + 1024 * 4


def test_a_gemm_operand_without_a_unit_stride_is_copied_first():
    # every other column of a (64, 193) fp16 matrix from column 1: strides (193, 2), offset 1.
    # cuBLAS takes no such operand; PyTorch clones it contiguous, a (64, 96) matrix from 0
    a = meta(64, 193, dtype=torch.float16)[:, 1::2]
    b = meta(96, 64, dtype=torch.float16)
    assert map_op("mm", (a, b), {}, None)[0].align == 8
    odd = meta(64, 193, dtype=torch.float16)[:, :96]  # a unit stride: passed as it is, lda 193
    assert map_op("mm", (odd, b), {}, None)[0].align == 1
    batched = meta(4, 64, 193, dtype=torch.float16)[:, :, 1::2]
    assert map_op("bmm", (batched, meta(4, 96, 64, dtype=torch.float16)), {}, None)[0].align == 8
    row = meta(1, 96, dtype=torch.float16).expand(64, 96)  # a broadcast row: stride 0, copied
    assert map_op("mm", (row, b), {}, None)[0].align == 8
