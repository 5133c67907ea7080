"""Compiled fusion counts a fused kernel's bytes at tensor level (kit.workload.fusion): each
external input region read once, only the outputs that leave the chain written. The expected
bytes are worked out here from the tensors' shapes."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kit.workload import zoo
from kit.workload.capture import capture
from kit.workload.fusion import apply_fusion

T, D = 4096, 256  # tokens, width
BF16, FP32, BOOL = 2, 4, 1
E = T * D * BF16  # one bf16 activation


def _fused(graph, phase="fwd"):
    return [n for n in apply_fusion(graph, "compiled")
            if n.op_class == "fused" and n.phase == phase]


class DropoutResidualNorm(nn.Module):
    """GPT-2's residual: Linear -> dropout -> + x -> LayerNorm -> Linear."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln, self.nxt = nn.Linear(D, D), nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return self.nxt(self.ln(F.dropout(self.fc(x), 0.1, self.training) + x))


def test_dropout_residual_layernorm_chain_moves_its_tensors_once():
    g = capture(DropoutResidualNorm(), (torch.empty(T, D, requires_grad=True),), mode="train",
                dtype="bf16")
    [fused] = _fused(g)
    assert fused.aten == "fused[native_dropout+add+native_layer_norm]"
    # reads: the fc output, x (whole: the old estimate cut it by the dropout mask's bytes), the
    # LayerNorm's weight and bias
    ext_in = E + E + 2 * D * BF16
    # writes: the dropout mask (its backward), the sum (the LayerNorm backward's input), the
    # LayerNorm's y (nxt and its weight gradient) and its mean and rstd (fp32, its backward);
    # not the dropout's y, which only the add reads
    ext_out = T * D * BOOL + E + E + 2 * T * FP32
    assert fused.out_bytes == ext_out
    assert fused.op.bytes == pytest.approx(ext_in + ext_out, rel=1e-12)


class QK(nn.Module):
    """GPT-2 attention's start: q and k made contiguous from one q|k|v GEMM output."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x):
        q, k, _v = self.qkv(x).view(8, T // 8, 3 * D).split(D, dim=-1)
        q, k = q.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous()
        return torch.bmm(q, k.transpose(1, 2))


def test_slices_of_one_gemm_output_read_their_own_bytes():
    g = capture(QK(), (torch.empty(T, D),), mode="inference", dtype="bf16")
    [fused] = _fused(g)
    assert [m.name() for m in (g.nodes[i] for i in fused.members)] == ["clone", "clone"]
    # reads q and k, two thirds of the q|k|v output (not all of it), writes their copies
    assert fused.op.bytes == pytest.approx(2 * E + 2 * E, rel=1e-12)
    assert fused.out_bytes == 2 * E


class NormThenChain(nn.Module):
    """A LayerNorm (y, mean, rstd) read by a GEMM and, as the residual, by a chain after it."""

    def __init__(self):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        h = self.ln(x)
        return F.gelu(self.fc(h)) + h


def test_a_chain_reads_only_the_output_of_a_multi_output_producer_it_uses():
    g = capture(NormThenChain(), (torch.empty(T, D, requires_grad=True),), mode="train",
                dtype="bf16")
    norm = next(n for n in g if n.name() == "native_layer_norm")
    assert norm.out_bytes == E + 2 * T * FP32  # y, mean and rstd
    [fused] = _fused(g)
    assert fused.aten == "fused[gelu+add]"
    # reads the fc output and the LayerNorm's y (not its mean and rstd); writes the sum, the
    # model's output (gelu's output is read by the add alone: its backward reads its input)
    assert fused.op.bytes == pytest.approx(E + E + E, rel=1e-12)
    assert fused.out_bytes == E


class DropoutThenChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        d = F.dropout(self.fc(x), 0.1, self.training)
        return F.gelu(self.fc2(d)) + d


def test_a_chain_does_not_read_the_dropout_mask_it_does_not_use():
    g = capture(DropoutThenChain(), (torch.empty(T, D),), mode="train", dtype="bf16")
    [fused] = _fused(g)
    assert fused.aten == "fused[gelu+add]"
    # reads fc2's output and the dropout's y (its bool mask goes to the backward pass only)
    assert fused.op.bytes == pytest.approx(E + E + E, rel=1e-12)


def test_records_are_regions_and_leave_a_node_hashable_and_its_equality_alone():
    from kit.workload.graph import Region

    g = capture(QK(), (torch.empty(T, D),), mode="inference", dtype="bf16")
    gemm, q, k = [n for n in g if not n.free][:3]
    [out] = gemm.writes
    assert isinstance(out, Region) and out.nbytes == out.storage == 3 * E
    # the copies read q and k: a third each of the GEMM's output, at their own offsets
    assert [(r.tensor, r.offset, r.nbytes) for r in q.reads + k.reads] == [
        (out.tensor, 0, E), (out.tensor, D * BF16, E)]
    assert not any(n.reads or n.writes for n in g if n.free)
    bare = replace(q, reads=(), writes=())
    assert bare == q and hash(bare) == hash(q)


def test_eager_mode_is_unchanged_and_a_graph_without_records_keeps_the_node_level_estimate():
    g = capture(DropoutResidualNorm(), (torch.empty(T, D, requires_grad=True),), mode="train",
                dtype="bf16")
    bare = g.with_nodes([replace(n, reads=(), writes=()) for n in g])
    eager, eager_bare = apply_fusion(g, "eager"), apply_fusion(bare, "eager")
    assert [(n.aten, n.op, n.deps, n.out_bytes) for n in eager] == \
        [(n.aten, n.op, n.deps, n.out_bytes) for n in eager_bare]
    assert [n.op for n in eager] == [n.op for n in g if not n.free]  # the mapping's costs
    # without records, the node-level estimate: it writes the dropout's whole output (y too)
    [new], [old] = _fused(g), _fused(bare)
    assert old.members == new.members and old.out_bytes == new.out_bytes + E


@pytest.mark.parametrize("family,optimizer", [("gpt2", None), ("llama", None), ("gpt2", "adamw")])
def test_replicated_layers_fuse_to_the_bytes_of_a_full_capture(family, optimizer):
    cfg = ({"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 5, "vocab_size": 100,
            "n_positions": 16} if family == "gpt2" else
           {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 5, "intermediate_size": 64,
            "vocab_size": 50})
    fast = zoo.graph_for(cfg, batch=2, seq=8, mode="train", optimizer=optimizer, disk=False)
    assert fast.meta.get("replicated_from") == 3
    model = zoo.build(cfg)
    full = capture(model, model.example_inputs(2, 8), mode="train", optimizer=optimizer,
                   loss=zoo.lm_loss(cfg["vocab_size"]))

    def fused(g):
        return [(n.aten, n.phase, n.op.bytes, n.out_bytes) for n in apply_fusion(g, "compiled")]

    # copies of the template layer write tensors of their own, and a kernel fused across two
    # layers (a residual add, then the next layer's norm) reads the sum its own member wrote;
    # the optimizer step, captured apart and appended, reads the gradients as tensors of its own
    assert fused(fast) == fused(full)
    assert any(n.op_class == "fused" and n.phase == "bwd" for n in apply_fusion(fast, "compiled"))


def test_a_compiled_adamw_step_reads_four_tensors_per_parameter_and_writes_three():
    model = nn.Sequential(nn.Linear(D, 2 * D), nn.Linear(2 * D, D))
    g = capture(model, (torch.empty(64, D),), mode="train", optimizer="adamw")
    param_bytes = sum(p.numel() for p in model.parameters()) * FP32
    [step] = [n for n in apply_fusion(g, "compiled") if n.phase == "opt"]
    assert step.op_class == "fused" and step.name().startswith("fused[_foreach_mul_+")
    # reads the parameters, their gradients and both moments; writes the parameters and the
    # moments back (they outlive the step), each once however many of the chain's ops update it
    assert step.op.bytes == pytest.approx(7 * param_bytes, rel=1e-12)
    assert step.out_bytes == 3 * param_bytes


def test_a_returned_tensor_a_later_member_reads_is_still_written():
    """y = gelu(l(x)); z = y * 2; return y, z: the fused [gelu + mul] kernel writes y too (the
    caller gets it), though the mul reads it on chip. It had been charged z's write alone."""
    import torch
    import torch.nn as nn

    from kit.workload.capture import capture
    from kit.workload.fusion import apply_fusion

    class TwoOut(nn.Module):
        def __init__(self, both):
            super().__init__()
            self.l, self.both = nn.Linear(256, 256), both

        def forward(self, x):
            y = torch.nn.functional.gelu(self.l(x))
            z = y * 2.0
            return (y, z) if self.both else z

    x = torch.randn(512, 256)
    one = 512 * 256 * 4  # bytes of l(x), y and z alike
    for both, tensors in ((False, 2), (True, 3)):  # read l(x); write z (and y)
        g = capture(TwoOut(both), (x,), mode="inference")
        fused = [n for n in apply_fusion(g, "compiled").nodes if n.op_class == "fused"]
        assert len(fused) == 1
        assert fused[0].op.bytes == pytest.approx(tensors * one)


def test_a_compiled_chain_writes_out_the_grown_dynamic_kv_cache():
    """A dynamic cache's torch.cat makes the next step's cache: a llama layer reads it only inside
    its fused [rotary + cat + repeat_kv clone] chain, which had never written it out (llama3-8b,
    batch 4, context 512, fp32: 84.2 MB a layer, as the static cache, where 101.0 MB move). Every
    layer's chain, template copies of a replicated capture included, reads the old keys and
    values, writes the grown ones, and writes them repeated for the query heads (SDPA's
    enable_gqa on a kernel without it). This had been checked against the static step, which
    moved the same repeat until 80b931a: a masked static step packs the query heads instead
    (HF's pack_gqa) and repeats nothing."""
    from kit.hardware import get_gpu
    from kit.workload.iteration import iteration

    b, ctx, heads, kv, d = 2, 40, 8, 2, 8
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": heads,
           "num_key_value_heads": kv, "num_hidden_layers": 6, "intermediate_size": 128,
           "vocab_size": 100, "name": "tiny-llama"}
    g = zoo.graph_for(cfg, batch=b, seq=ctx, mode="decode", dtype="fp32", disk=False, kv_cache="dynamic")
    assert g.meta.get("replicated_from") == 3
    chains = {}  # a layer's fused chains that hold the cache's cat
    for n in apply_fusion(g, "compiled"):
        if n.layer is not None and n.op is not None and n.op_class == "fused" and "cat" in (n.aten or ""):
            chains[n.layer] = chains.get(n.layer, 0) + n.op.bytes
    assert sorted(chains) == list(range(6))
    old = 2 * b * kv * ctx * d * FP32  # keys and values before the step
    grown = old * (ctx + 1) / ctx  # ... after it, written out for the next step
    repeated = grown * heads // kv  # ... repeated for the query heads
    # the rest is the new token's rows (q, k, v and the rotary tables): under 5% here
    assert all(old + grown + repeated <= chains[i] <= 1.05 * (old + grown + repeated) for i in range(6)), chains

    # the step as a whole: compiled, the dynamic cache costs at least its write at peak
    # bandwidth more than the static one (had cost the same, 20.62 ms); eager keeps its order
    gpu = get_gpu("h100-sxm")
    its = {(k, f): iteration(zoo.graph_for("llama3-8b", 4, 512, "decode", "fp32", disk=False,
                                           kv_cache=k), gpu, fusion=f)
           for k in ("static", "dynamic") for f in ("eager", "compiled")}
    written = 32 * 2 * 4 * 8 * 512 * 128 * FP32  # layers x (keys, values) x b x kv x ctx x d
    assert its["dynamic", "eager"].kernel_ms >= its["static", "eager"].kernel_ms
    gap = its["dynamic", "compiled"].kernel_ms - its["static", "compiled"].kernel_ms
    assert gap >= 0.9 * written / gpu.mem_bw_bytes_per_s * 1e3, gap


class _ListCacheDecoder(nn.Module):
    """A user's decoder whose cache grows by torch.cat and is stored back into the cache list it
    was given (as HF's DynamicCache keeps it), then repeated for its grouped query heads."""

    def __init__(self):
        super().__init__()
        self.emb, self.q = nn.Embedding(10, 64), nn.Linear(64, 32)
        self.kv, self.out = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, ids, cache):
        b = ids.shape[0]
        x = self.emb(ids)
        q = self.q(x).view(b, 1, 4, 8).transpose(1, 2)
        k, v = self.kv(x).view(b, 1, 2, 16).transpose(1, 2).chunk(2, dim=-1)
        cache[0] = torch.cat((cache[0], k * 2.0), 2)
        cache[1] = torch.cat((cache[1], v.contiguous()), 2)
        kk, vv = (c[:, :, None].expand(b, 2, 2, -1, 8).reshape(b, 4, -1, 8) for c in cache)
        return self.out(F.scaled_dot_product_attention(q, kk, vv).transpose(1, 2).reshape(b, 1, 32))

    def decode_inputs(self, batch, context):
        return (torch.zeros(batch, 1, dtype=torch.long),
                [torch.zeros(batch, 2, context, 8), torch.zeros(batch, 2, context, 8)])


def test_a_cache_the_step_leaves_in_its_inputs_is_written_out():
    """The grown cache a user's decoder stores into its input list outlives the step: its
    compiled [cat + clone] chain had written only the clones (51,712 of 77,568 bytes out)."""
    from kit.workload.models import graph_of

    b, ctx = 2, 100
    g = graph_of(_ListCacheDecoder(), b, ctx, mode="decode", dtype="fp32")
    [chain] = [n for n in apply_fusion(g, "compiled") if n.op_class == "fused" and "cat" in n.name()]
    grown = 2 * b * 2 * (ctx + 1) * 8 * FP32  # keys and values: b x 2 heads x ctx + 1 x 8
    clones = 2 * b * 4 * (ctx + 1) * 8 * FP32  # repeated to 4 heads
    assert chain.out_bytes >= grown + clones, chain.out_bytes


class StaticCache(nn.Module):
    """A decode step's static KV cache: the new token's k written in place, one row of 2,048."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(4, 12, 2048, 64))
        self.proj = nn.Linear(768, 768)

    def forward(self, x, pos):
        k = torch.relu(self.proj(x)).view(4, 1, 12, 64).transpose(1, 2)
        self.k.index_copy_(2, pos, k)
        return self.k[:, :, :8].sum()


def test_a_fused_index_copy_writes_its_rows_not_its_whole_target():
    """Compiled, the index_copy_ joins the chain that makes its rows; the chain had been charged
    the whole 25 MB cache written (its region) for 12 kB of new rows."""
    g = capture(StaticCache(), (torch.empty(4, 1, 768), torch.tensor([5])), mode="inference")
    compiled = apply_fusion(g, "compiled")
    [store] = [n for n in compiled if "index_copy_" in n.aten]
    assert store.op_class == "fused" and "relu" in store.aten  # the producer of its rows fused
    alone = {n.id: n for n in g.nodes}
    members = sum(float(alone[m].op.bytes) for m in store.members)
    assert store.op.bytes <= members * (1 + 1e-12), (store.op.bytes, members)
    assert store.op.bytes < 4 * 12 * 2048 * 64 * FP32 / 100


class MoECombine(nn.Module):
    """out = 0; out.index_add_(0, token, gate * expert output); then a sum over out."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(D, D)

    def forward(self, x, idx, gate):
        y = self.w(x.index_select(0, idx)) * gate[:, None]
        out = torch.zeros_like(x)
        out.index_add_(0, idx, y)
        return out.sum()


def test_an_indexed_store_does_not_fuse_with_its_targets_fill_or_its_readers():
    """An index_add_ into zeros runs after the kernel that zeroes its target and before the one
    that reads it (Inductor runs them as kernels of their own). One chain [mul, zeros_like,
    index_add_, sum] had been charged 12.7 MB for a step that writes the zeros, reads the
    8 MB of expert rows and reads the result back: at least 16.8 MB."""
    k = 2
    g = capture(MoECombine(), (torch.empty(T, D), torch.randint(0, T, (T * k,)), torch.empty(T * k)),
                mode="inference")
    compiled = apply_fusion(g, "compiled")
    alone = {n.id: n for n in g.nodes}
    for n in compiled:
        names = [alone[m].name() for m in (n.members or (n.id,))]
        if "index_add_" in names:
            assert not {"zeros_like", "sum"} & set(names), names
    moved = sum(float(n.op.bytes) for n in compiled if n.op_class not in ("gemm", "indexing")
                or "index_add" in n.aten)
    out, rows = T * D * FP32, T * k * D * FP32
    assert moved >= out + rows + out, (moved, out + rows + out)


class RowNormalise(nn.Module):
    """x / x.sum(-1, keepdim=True) between two GEMMs: a reduction whose input the div reads again
    (whole: x / x.sum(), a reduction over the whole tensor)."""

    def __init__(self, cols, whole=False):
        super().__init__()
        self.fc, self.nxt, self.whole = nn.Linear(64, cols), nn.Linear(cols, 64), whole

    def forward(self, x):
        h = self.fc(x)
        return self.nxt(h / (h.sum() if self.whole else h.sum(-1, keepdim=True)))


@pytest.mark.parametrize("cols", [2048, 50257])
def test_a_looped_reduction_re_reads_a_row_that_spills_every_l2(cols):
    """Inductor reduces a row over 1,024 elements in a loop and reads it again for the div: from
    L2 while the resident rows fit (2,048 fp32: 8 kB rows), from DRAM for vocabulary rows (201 kB),
    which had been counted once (2 tensors moved for 3)."""
    rows = 256
    g = capture(RowNormalise(cols), (torch.empty(rows, 64),), mode="inference")
    [fused] = _fused(g)
    assert fused.aten == "fused[sum+div]"
    one = rows * cols * FP32
    passes = 3 if cols * FP32 >= 87 * 1024 else 2
    assert fused.op.bytes == pytest.approx(passes * one, rel=1e-12)
    assert fused.out_bytes == one


class CastLogSoftmax(nn.Module):
    """An LM loss's start: bf16 logits cast to fp32, then log_softmax over the vocabulary (read by
    a GEMM, whose backward hands the log-softmax backward its gradient from outside the chain)."""

    def __init__(self, vocab):
        super().__init__()
        self.head, self.tail = nn.Linear(64, vocab), nn.Linear(vocab, 8)

    def forward(self, x):
        return self.tail(torch.log_softmax(self.head(x).float(), dim=-1).to(x.dtype))


def test_a_vocabulary_log_softmax_chain_reads_its_logits_twice_and_its_backward_its_gradient_twice():
    rows, vocab = 128, 50257
    g = capture(CastLogSoftmax(vocab), (torch.empty(rows, 64, requires_grad=True),), mode="train",
                dtype="bf16")
    fwd = next(n for n in _fused(g) if "_log_softmax" in n.aten)
    logits, logp = rows * vocab * BF16, rows * vocab * FP32
    # reads the bf16 logits for the max and the sum, again for the output; writes the fp32
    # log-probs (saved for the backward) and their bf16 cast (the tail's input)
    assert fwd.op.bytes == pytest.approx(2 * logits + logp + logits, rel=1e-12)
    bwd = [n for n in apply_fusion(g, "compiled") if n.phase == "bwd" and "_log_softmax_backward" in n.aten]
    assert len(bwd) == 1
    # the bf16 gradient (the tail's input gradient, cast to fp32 in the chain) read for its sum
    # and again with the log-probs for the output
    # and writes the bf16 gradient of the logits (and reads the tail's 2 kB bias gradient sum)
    assert bwd[0].op.bytes == pytest.approx(2 * logits + logp + logits, rel=1e-3)


def test_a_broadcast_slice_of_a_buffer_is_read_as_its_own_elements():
    """relu(h) + table[:1].expand(T, D): the fused kernel reads h and one row of the table, and
    writes its output. The region of the expanded slice had counted its T x D elements (4 MiB
    of an 8 MiB buffer) where the kernel reads one 1 KiB row, as eager's add already counts."""
    class Row(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.n = nn.Linear(D, D), nn.Linear(D, D)
            self.register_buffer("table", torch.zeros(2 * T, D))

        def forward(self, x):
            return self.n(torch.relu(self.l(x)) + self.table[:1].expand(T, D))

    g = capture(Row(), (torch.empty(T, D),), mode="inference")
    [fused] = _fused(g)
    assert fused.op.bytes == pytest.approx(2 * T * D * FP32 + D * FP32)


class ConvPool(nn.Module):
    """A CNN stem: conv -> relu -> max pool -> conv."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.c2(F.max_pool2d(torch.relu(self.c1(x)), 2))


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_pools_indices_are_written_only_where_the_backward_reads_them(mode):
    """Inference, nothing reads max_pool2d_with_indices's int64 indices and Inductor drops them;
    the chain had been charged them (8 bytes an output element beside the pooled 2): vgg16's
    compiled chains 55.1 MB where 30.6 MB move. Training, its backward reads them (and the
    relu's its output)."""
    b, c, hw = 8, 16, 64
    g = capture(ConvPool(), (torch.empty(b, 3, hw, hw, requires_grad=mode == "train"),), mode=mode,
                dtype="bf16")
    [chain] = _fused(g)
    assert chain.aten == "fused[relu+max_pool2d_with_indices]"
    conv_out, pooled = b * c * hw * hw * BF16, b * c * (hw // 2) ** 2 * BF16
    indices = pooled // BF16 * 8
    written = pooled + (indices + conv_out if mode == "train" else 0)
    assert chain.out_bytes == written
    assert chain.op.bytes == pytest.approx(conv_out + written, rel=1e-12)


class _Holder:
    """A plain output object: capture's output_tensors does not see into it."""

    def __init__(self, y):
        self.y = y


class HeldOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(D, D)

    def forward(self, x):
        return _Holder(F.gelu(self.l(x)) * 2.0)


def test_a_chains_only_output_is_written_though_nothing_the_graph_knows_reads_it():
    """A dead output is an unread one beside a used one (a pool's indices); a chain's last
    tensor, which nothing reads, may be the model's output in an object the capture cannot open."""
    g = capture(HeldOutput(), (torch.empty(T, D),), mode="inference", dtype="bf16")
    [chain] = _fused(g)
    assert chain.out_bytes == E and chain.op.bytes == pytest.approx(2 * E, rel=1e-12)


@pytest.mark.parametrize("rows", [16, 512])
def test_a_whole_tensor_reduction_re_reads_its_input_for_its_broadcast(rows):
    """The div cannot write before the sum has read all of h: an h of 512 KB (past the 87 KB
    REREAD_ROW_BYTES) is read twice, as a vocabulary row is; it had been counted once, its 256
    columns taken for its rows (2 passes for 3). 16 KB stays one read."""
    cols = 256
    g = capture(RowNormalise(cols, whole=True), (torch.empty(rows, 64),), mode="inference")
    [fused] = _fused(g)
    assert fused.aten == "fused[sum+div]"
    one = rows * cols * FP32
    passes = 3 if one >= 87 * 1024 else 2
    assert fused.op.bytes == pytest.approx(passes * one, rel=1e-12)


class ColumnNormalise(nn.Module):
    """x / x.sum(1) over a [2, 64, 32768] x: a reduction over a middle dim shorter than the last."""

    def __init__(self, keepdim):
        super().__init__()
        self.keepdim = keepdim

    def forward(self, x):
        s = x.sum(1, keepdim=True) if self.keepdim else x.sum(1).unsqueeze(1)
        return x / s + 1.0


@pytest.mark.parametrize("keepdim", [True, False])
def test_a_middle_dim_reduction_takes_what_each_output_reduces_for_its_row(keepdim):
    """65,536 sums of 64 elements (256 B each) hold their columns: x is read once, the chain 2
    passes. Taken as 128 rows of 32,768 (128 kB, past REREAD_ROW_BYTES) it had been 3, as a
    last-dim sum of such rows is; and a compiled chain moves no more than its eager kernels."""
    shape = (2, 64, 32768)
    g = capture(ColumnNormalise(keepdim), (torch.empty(*shape),), mode="inference")
    [fused] = _fused(g)
    one = shape[0] * shape[1] * shape[2] * FP32
    assert fused.op.bytes == pytest.approx(2 * one, rel=1e-12)
    eager = apply_fusion(g, "eager")
    assert fused.op.bytes <= sum(float(n.op.bytes) for n in eager.nodes if n.op is not None)
