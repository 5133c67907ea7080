"""The per-token kernels of Megatron's vocab-parallel embedding and cross entropy
(megatron-core 0.16.1 tensor_parallel/layers.py lines 274-290, cross_entropy.py lines 45-117)
that kit.parallel.gpt's embedding and head blocks run: counted against torch's own dispatch of
the source's statements, and their bytes by hand (int64 ids 8, a bool mask 1, fp32 4 bytes)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kit import ops
from kit.parallel import GPTSpec, Layout
from kit.parallel.costs import AnalyticSource
from kit.parallel.gpt import head_backward, head_forward
from kit.parallel.vocab_kernels import OutputMask, TokenKernel

torch.set_num_threads(1)
SPEC = GPTSpec(layers=2, hidden=1024, heads=16, seq=1024, vocab=50257, attention="unfused")
NO_KERNEL = {"view", "unsqueeze", "lift_fresh", "embedding", "exp", "sum", "max", "div_", "sub_"}


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _torch_kernels(run) -> list:
    with _Ops() as log:
        run()
    return log.names


def _ids_mask(ids, start, end):  # layers.py lines 276-279 and cross_entropy.py lines 48-50
    mask = (ids < start) | (ids >= end)
    masked = ids.clone() - start
    masked[mask] = 0
    return mask, masked


def _ce_forward(logits, sum_exp, target, start, end):  # cross_entropy.py lines 48-62 and 77
    mask, masked = _ids_mask(target, start, end)
    arange = torch.arange(start=0, end=logits.size(0))
    pred = logits[arange, masked].clone().contiguous()
    pred[mask] = 0.0
    return torch.log(sum_exp) - pred


def _per_token(blocks) -> list:
    return [op for blk in blocks for op in blk.ops if isinstance(op, TokenKernel)]


def test_cross_entropy_forward_runs_torchs_per_token_kernels_at_every_tp():
    logits, target = torch.randn(8, 16), torch.randint(0, 64, (8,))
    sum_exp = logits.exp().sum(-1)
    names = [n for n in _torch_kernels(lambda: _ce_forward(logits, sum_exp, target, 16, 32))
             if n not in NO_KERNEL]
    # each index_put_ a masked_fill_ (kit.parallel.vocab_kernels), one kernel
    assert names == ["lt", "ge", "bitwise_or", "clone", "sub", "index_put_", "arange", "index",
                     "clone", "index_put_", "log", "sub"]
    b = 2
    tok = b * SPEC.seq
    by_hand = tok * ((8 + 1) + (8 + 1) + 3 + 16 + 16 + (8 + 1 + 8)  # the target mask
                     + 8 + (16 + 4 + 4) + 8 + (4 + 1 + 4)  # arange, gather, clone, masked fill
                     + 8 + 12)  # log(sum), minus predicted
    # at micro-batch 2 also megatron-core 0.16.1 language_module.py lines 139 and 170: the
    # labels' [b, s] -> [s, b] copy (int64: read 8, write 8) and the loss's back (fp32: 4 + 4)
    by_hand += tok * (16 + 8)
    for tp in (1, 4):
        small = _per_token(head_forward(SPEC, b, tp, "fp16"))
        assert len(small) == len(names) + 2
        assert sum(op.bytes for op in small) == by_hand


def test_cross_entropy_backward_runs_six_per_token_kernels():
    """cross_entropy.py lines 97-99 and 114: arange, mask.float(), 1 - it, and the -= on an
    advanced index as Python runs it (index, sub_, index_put_)."""
    grad, target = torch.randn(8, 16), torch.randint(0, 16, (8,))
    mask = torch.zeros(8, dtype=torch.bool)

    def run():
        arange = torch.arange(start=0, end=8)
        update = 1.0 - mask.view(-1).float()
        grad[arange, target] -= update
    names = [n for n in _torch_kernels(run) if n not in {"view"}]
    assert names == ["arange", "_to_copy", "rsub", "index", "sub_", "index_put_"]
    b = 2
    tok = b * SPEC.seq
    for tp in (1, 4):
        small = _per_token(head_backward(SPEC, b, tp, "fp16"))
        assert len(small) == len(names)
        assert sum(op.bytes for op in small) == tok * (8 + 5 + 8 + 24 + 12 + 24)


def test_vocab_parallel_embedding_masks_ids_and_rows_at_tp_over_1():
    """At tp > 1 six per-token kernels mask the ids and a masked_fill_ zeroes the masked rows of
    [tokens, hidden] (read and write 2 bytes an element, the mask a byte a token); its backward
    is autograd's clone and masked_fill_ of the gradient, one kernel each over [tokens, hidden];
    at tp 1 none of them."""
    ids, weight = torch.randint(0, 64, (2, 4)), torch.randn(16, 4, requires_grad=True)

    def run():
        mask, masked = _ids_mask(ids, 16, 32)
        out = torch.nn.functional.embedding(masked, weight)
        out[mask, :] = 0.0
        out.backward(torch.ones_like(out))
    names = [n for n in _torch_kernels(run) if n not in NO_KERNEL | {"ones_like", "detach", "expand"}]
    assert names == ["lt", "ge", "bitwise_or", "clone", "sub", "index_put_", "index_put_",
                     "zeros", "index_put", "embedding_dense_backward"]
    b, d = 2, 2
    tok, h = b * SPEC.seq, SPEC.hidden
    src = AnalyticSource(SPEC, Layout(tp=4, micro_batch=b, dtype="fp16"))
    fwd, bwd = src.embedding
    small = _per_token(fwd)
    assert len(small) == 6  # the first six names
    assert sum(op.bytes for op in small) == tok * (9 + 9 + 3 + 16 + 16 + 17)
    rows = [op for blk in fwd for op in blk.ops if isinstance(op, OutputMask)]
    assert [op.bytes for op in rows] == [2 * tok * h * d + tok]
    assert not _per_token(bwd)
    after = [op for blk in bwd for op in blk.ops]
    i = next(k for k, op in enumerate(after) if isinstance(op, OutputMask))
    # index_put's backward, before the lookup's: zeros is a one-element CPU tensor, then clone
    # and masked_fill_ of the [tokens, hidden] gradient
    assert isinstance(after[i - 1], ops.Elementwise) and after[i - 1].bytes == 2 * tok * h * d
    one = AnalyticSource(SPEC, Layout(tp=1, micro_batch=b, dtype="fp16")).embedding
    assert not any(isinstance(op, (TokenKernel, OutputMask)) for blks in one for blk in blks
                   for op in blk.ops)


def test_per_token_kernels_cost_what_they_cost_in_the_stream():
    """A per-token kernel of a few kB is its bytes at the GPU's bandwidth plus a kernel's start
    in the stream, 2 us (docs/accuracy.md: "a kernel in the stream takes at least 2 us more than its
    roofline"), in either mode of the analytic layer, and not scaled by the host profile's
    other_scale: priced at the tile predictor's isolated time (26.9 us on an A100-SXM4-40GB,
    its ~25 us floor) x other_scale it had been 14.4 us. The layer's other kernels keep their
    isolated times (the calibration the megatron-a100 profile was fitted on)."""
    from kit.hardware.system import get_system
    from kit.parallel.costs import Coster
    from kit.parallel.profiles import get_profile

    host, system = get_profile("megatron-a100"), get_system("dgx-a100")
    lay = Layout(tp=4, micro_batch=2, dtype="fp16")
    small = (_per_token(head_forward(SPEC, 2, 4, "fp16"))
             + _per_token(head_backward(SPEC, 2, 4, "fp16"))
             + _per_token(AnalyticSource(SPEC, lay).embedding[0]))
    assert len(small) == 12 + 2 + 6 + 6  # the loss's two transposes at micro-batch 2
    plain = ops.Elementwise("copy", small[0].numel, "fp32")  # the same bytes, another kernel
    for in_stream in (False, True):
        coster = Coster(lay, system, "tile", None, host, "mid", in_stream)
        coster.predict_ops([*small, plain])
        bw_bytes_per_ms = system.gpu.mem_bw_gbs * 1e9 / 1e3
        for op in small:
            assert coster.op_ms(op) == pytest.approx(op.bytes / bw_bytes_per_ms + 2e-3, abs=1e-6)
        if not in_stream:  # the isolated calibration the other kernels keep: over 10 us here
            assert coster.op_ms(plain) > 10e-3


def test_per_token_kernels_are_issued_at_an_eager_ops_host_cost():
    """Each per-token kernel is an eager aten op: Python and the dispatcher, ~10 us, and a
    cudaLaunchKernel, ~5 us (the single-GPU path's CpuOverhead), 15 us of host time. The
    megatron-a100 profile's launch_us, 64.6 us, is fitted per kernel the analytic layer lists and
    so already holds the host time of ops it does not list, these among them: charged it, the 24
    kernels of a tp 4 micro-batch had added 1.55 ms of host time, 0.36 ms at an eager op's. A
    profile whose launch is less than an eager op's (the unfitted default, 10 us) keeps its own;
    the layer's other kernels keep the profile's launch."""
    from kit.hardware.system import get_system
    from kit.parallel.build import HostModel
    from kit.parallel.costs import Coster, Phase
    from kit.parallel.gpt import Block
    from kit.parallel.profiles import get_profile

    lay = Layout(tp=4, micro_batch=2, dtype="fp16")
    small = _per_token(head_forward(SPEC, 2, 4, "fp16"))
    plain = ops.Elementwise("copy", small[0].numel, "fp32")
    for host, per_op_ms in ((get_profile("megatron-a100"), 15e-3), (HostModel(), 10e-3)):
        coster = Coster(lay, get_system("dgx-a100"), "tile", None, host, "mid", False)
        phase = Phase()
        coster.add(phase, [Block("loss", [*small, plain])], 0)
        assert phase.seq_host_ms == pytest.approx([per_op_ms] * len(small) + [host.launch_us / 1e3])
