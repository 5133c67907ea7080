"""Memory per rank of a GPT-style training job: weights, gradients, optimizer state, activations.

Model states, as Megatron-LM's mixed-precision Adam holds them (docs/source/api-guide/
dist_optimizer.md, its bytes-a-parameter table: fp16 params and fp16 grads 20, bf16 params and
fp32 grads 18, fp32 params and fp32 grads 16; with the distributed optimizer over d ranks
4 + 16/d, 6 + 12/d and 8 + 8/d): the model's weights and gradients (Layout.grad_dtype: fp32 for
a bf16 model by default), then the optimizer's fp32 state, master weights, momentum and
variance, and, when the gradients are 16-bit, the fp32 copy of them the optimizer steps with
(Float16OptimizerWithFloat16Params' main_param.grad = main_grad.float()). So 2 + 2 + 16 in fp16,
2 + 4 + 12 in bf16, 4 + 4 + 8 in fp32. The ZeRO paper (Rajbhandari et al., SC'20) counts
2 + 2 + K = 12 for fp16, leaving out that fp32 gradient copy; the kit had too, 16 B where
Megatron's table has 20. ZeRO-1 shards the optimizer state over the DP ranks (Megatron's
distributed optimizer: its sharded "main params and main grads" are this state), ZeRO-2 also
the gradients, ZeRO-3 (FSDP) also the weights.

Activations per layer and micro-batch (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", 2022, Table 2; activation_bytes_per_layer writes their count for
grouped-query attention, gated MLPs and MoE layers too), in bytes for 2-byte activations, for
their GPT layer:

    no recompute, TP only           s·b·h·(10 + 24/t + 5·a·s/(h·t))
    + sequence parallel             s·b·h·(34 + 5·a·s/h) / t
    selective recompute             drops the 5·a·s/h term (flash attention never stores it)
    full recompute                  2·s·b·h (only each layer's input; /t with SP)

A stage holds the activations of the chunks it has run forward but not yet backward: the peak
of its pipeline schedule (pp − s for 1F1B, all m for GPipe), each chunk's own bytes, with the
embedding's dropout mask on the first chunk and the output layer's on the last
(edge_activation_bytes).
"""
from __future__ import annotations

from kit.parallel.gpt import GPTSpec, fused_softmax_available, vocab_per_rank
from kit.parallel.layout import Layout
from kit.parallel.schedule import in_flight, peak_held

GIB = 2**30


def stage_layers(spec: GPTSpec, layout: Layout) -> list[list[int]]:
    """Layer indices per (stage, chunk) virtual stage, in pipeline order: chunk-major."""
    n_virtual = layout.pp * layout.virtual_stages
    base, extra = divmod(spec.layers, n_virtual)
    if base == 0:
        from kit.errors import KitError

        raise KitError(f"{spec.layers} layers cannot fill pp {layout.pp} x virtual stages "
                       f"{layout.virtual_stages} = {n_virtual} pipeline stages")
    out, i = [], 0
    for v in range(n_virtual):
        n = base + (1 if v < extra else 0)
        out.append(list(range(i, i + n)))
        i += n
    return out


def layer_expert_params(spec: GPTSpec, layer: int) -> int:
    """The expert weights and biases of a layer (0 for a dense one): what expert parallelism
    shards (GPTSpec.layer_params counts each expert's f + h biases with it; they had been left
    with the dense parameters, replicated over the EP ranks)."""
    if not spec.is_moe(layer):
        return 0
    return spec.experts * spec.mlp_params


def tp_replicated_params(spec: GPTSpec, layer: int) -> int:
    """Of a layer's parameters outside its experts, those every TP rank holds whole: the two
    norms' weights and biases (4h), the attention output projection's bias and a dense MLP's
    second bias (row-parallel linears add their bias after the all-reduce), or a MoE layer's
    router, experts x h (Megatron-core's TopKRouter weight is not split). Without biases (GPTSpec.bias:
    Llama's RMSNorm weights alone) 2h, or the router's weight with them. And Qwen3's q/k norms
    (GPTSpec.qk_norm_params), a head wide each, which every rank applies to its own heads:
    Megatron-core builds q_layernorm and k_layernorm hidden_size_per_attention_head wide
    (megatron-core 0.16.1 transformer/attention.py lines 1280-1296), not split by tp; the kit had
    divided them by tp (Qwen3-8B at tp 8: 36 x 2 x 128 x 7/8 = 8,064 weights a rank short)."""
    norms_and_out_bias = 2 * spec.norm_params + (spec.hidden if spec.out_bias else 0) + spec.qk_norm_params
    return norms_and_out_bias + (spec.experts * spec.hidden if spec.is_moe(layer) else spec.mlp_out_bias)


def layer_rank_params(spec: GPTSpec, layout: Layout, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters of a layer that one rank holds: TP splits the weights and the
    column-parallel biases, not tp_replicated_params; EP splits the experts, each expert's second
    bias whole on its TP ranks. Dividing those by tp too had left out 6h x 7/8 a GPT-3 175B layer
    at tp 8 (64,512 of 226.5 M: 0.03%)."""
    t, e = layout.tp, layout.ep
    experts = layer_expert_params(spec, layer)
    kept = tp_replicated_params(spec, layer)
    dense = (spec.layer_params(layer) - experts - kept) / t + kept
    expert_bias = spec.experts * spec.mlp_out_bias if experts else 0
    return dense, ((experts - expert_bias) / t + expert_bias) / e


def local_expert_params(spec: GPTSpec, layout: Layout, stage: int) -> float:
    """Of local_params, the expert weights one rank of `stage` holds (its EP shard): ZeRO shards
    them over the expert-DP group (dp / ep ranks), not over the whole DP group."""
    chunks = stage_layers(spec, layout)
    return sum(layer_rank_params(spec, layout, layer)[1]
               for c in range(layout.virtual_stages) for layer in chunks[c * layout.pp + stage])


def zero_kept(params: float, experts: float, layout: Layout, zero_from: int) -> float:
    """Of a rank's params (experts of them its expert shard), what it keeps of a state that ZeRO
    shards from stage zero_from on (1: optimizer state, 2: gradients, 3: weights): the dense part
    over the DP group, the expert shard over the expert-DP group (dp / ep ranks)."""
    if layout.zero < zero_from:
        return params
    return (params - experts) / layout.dp + experts / (layout.dp // layout.ep)


def local_params(spec: GPTSpec, layout: Layout, stage: int) -> float:
    """Parameters one rank of `stage` holds (TP- and EP-sharded), before ZeRO."""
    chunks = stage_layers(spec, layout)
    n = sum(sum(layer_rank_params(spec, layout, layer))
            for c in range(layout.virtual_stages) for layer in chunks[c * layout.pp + stage])
    return n + sum(edge_params(spec, layout, stage))


def edge_params(spec: GPTSpec, layout: Layout, stage: int) -> tuple[float, float]:
    """Parameters of a stage outside its layers, per rank: (the embedding, on its first chunk;
    the output layer and the final norm, on its last chunk). The vocabulary is Megatron's padded
    one (kit.parallel.gpt.padded_vocab), as the lookup, the logits and the embedding group's
    all-reduce have it: its weights, gradients and optimizer state are that wide."""
    t = layout.tp
    vocab_rank = vocab_per_rank(spec.vocab, t)
    first = (vocab_rank * spec.hidden + (0 if spec.rope else spec.positions * spec.hidden)
             + spec.token_types * spec.hidden if stage == 0 else 0.0)  # BERT's token types, whole
    last = 0.0
    if stage == layout.pp - 1:
        if layout.pp > 1 or not spec.tied:
            last += vocab_rank * spec.hidden  # the output layer: untied, or the tied copy on the last stage
        last += spec.norm_params  # the final norm (as GPTSpec.params counts it), replicated over tp
        # BERT's pooler, MLM transform and NSP dense, whole on every rank, and the output
        # layer's bias, split over tp with its vocabulary
        last += spec.pretraining_dense_params + (vocab_rank if spec.pretraining_heads else 0)
    return first, last


def activation_bytes_per_layer(spec: GPTSpec, layout: Layout, layer: int | None = None) -> float:
    """Korthikanti et al.'s count, per token in units of 2-byte activations, written for any
    GPT-style layer (their GPT: kv = a heads, f = 4h, GeLU, dense):

        replicated     10h: both norms' inputs (4h), both dropout masks (2h), the QKV and the
                       first MLP GEMMs' inputs (2h + 2h)
        attention/t    Q (2h), K and V (2h·kv/a each; 2h each where the unfused path
                       repeats them to the query heads), the output projection's input (2h),
                       the rest of the QKV GEMM's output where a saved V view keeps it
                       (_qkv_output_kept: RoPE without GQA unfused, RoPE or GQA selective);
                       flash attention keeps its output in place of the scores' inputs
        MLP/t          4f (the activation's and the down GEMM's inputs), 6f when gated (the
                       gate and up outputs, and their product); an MoE layer runs it for topk
                       routed copies of each token, whose dispatched inputs add 2h·topk,
                       not divided by t (gathered over TP before the experts), and whose
                       returned rows, which the router's weights multiply, 2h·topk more
        scores/t       5·a·s (softmax output, its dropout mask and output), unless flash or
                       selective recompute; 7·a·s where torch's fallback softmax runs in fp32
                       (attention_bytes_per_token)

    so GPT's layer is s·b·h·(10 + 24/t + 5as/(ht)) as in their Table 2, in bytes at 16-bit
    activations; at fp32 each count but the 1-byte dropout masks doubles."""
    s, b, h, t = spec.seq, layout.micro_batch, spec.hidden, layout.tp
    scale = 2.0 if layout.dtype == "fp32" else 1.0  # the paper counts 2-byte activations
    if layout.recompute == "full":
        return scale * 2 * s * b * h / (t if layout.sequence_parallel else 1)
    mlp = (6 if spec.gated else 4) * spec.f
    gathered = 0.0  # an MoE layer's dispatched expert inputs, whole on every tp rank
    if layer is not None and spec.is_moe(layer):  # the router's input is the MLP input counted above
        # topk routed copies a token, or the capacity buffers' rows a token (GPTSpec.routed_rows),
        # each through the experts at f/tp; their h-wide inputs, which fc1's weight gradient
        # reads, are the rows the all-gather over TP collected (Megatron-core 0.9's
        # MoEAlltoAllTokenDispatcher, kit.parallel.gpt._moe_blocks): every tp rank holds all of
        # them. Divided by tp with the rest, Mixtral-8x7b's layer at seq 4096, tp 8 under
        # sequence parallelism had held 8 MiB of them where it holds 64
        routed = spec.routed_rows(s * b) / (s * b)
        # and back on the shard, after the reduce-scatter and the combine all-to-all, unpermute
        # multiplies the routed rows by the router's probs (moe_utils.py: unpermuted_tokens *
        # probs; with capacity padding probs * permuted_tokens, the all-to-all's output), and
        # that product saves the rows for the probs' gradient: another 2h a routed row, split
        # over tp with the shard. Left out, Mixtral-8x7b's layer at seq 4096, bf16 held 944 MiB
        # at tp 1 where 1008 are, 174 at tp 8 with sequence parallelism where 182 are
        mlp, gathered = routed * (mlp + 2 * h), routed * 2 * h
    # the dropout masks (2h of the 10h) are torch's bool masks, 1 byte an element in fp32 too:
    # scaled with the rest, GPT-3 175B's fp32 layer at tp 8 had counted 20h bytes a token where
    # 18h are held. At dropout 0 (GPTSpec.dropout: Llama's) torch's dropout returns its input:
    # no masks. Llama-3-8B's layer at tp 1 had counted 2h = 8 KiB a token of masks it does not keep
    drops = spec.dropout > 0
    replicated = scale * 8 * h + (2 * h if drops else 0)
    core = attention_bytes_per_token(spec, layout)
    if layout.sequence_parallel:
        return s * b * ((replicated + scale * mlp) / t + core + scale * gathered)
    return s * b * (replicated + scale * mlp / t + core + scale * gathered)


def attention_bytes_per_token(spec: GPTSpec, layout: Layout) -> float:
    """Bytes a token's core attention leaves saved for backward on one TP rank (the attention/t
    and scores/t rows of activation_bytes_per_layer), as megatron-core 0.16.1 runs it and torch's
    autograd keeps it: Q, K and V, the output projection's input, and in the unfused path the
    score-side tensors. What each op's backward saves (torch 2.13's autograd nodes, measured with
    saved_tensors_hooks in tests/test_parallel_attention_saved_bytes.py):

        baddbmm(buffer, Q, K^T, beta 0)   batch1 and batch2, Q and K (not its output)
        bmm(probs, V)                     both inputs: the probabilities and V
        repeat_interleave (GQA)           nothing (unsqueeze, expand, clone, flatten)
        .float(), .bfloat16()             nothing (ToCopyBackward0)
        masked_fill_(mask, -10000)        the mask only (an input, shared by the layers)
        torch softmax                     its fp32 output
        fused scale-mask-softmax          softmax_results, in the input dtype (fusions/
                                          fused_softmax.py lines 36, 86), not its input
        native_dropout (CUDA)             its bool mask; the bmm keeps its output
        permute(2, 0, 1, 3).contiguous()  nothing; the copy is the projection's input

    GQA: where np // ng > 1 the unfused path repeats K and V to the query heads before the bmms
    (transformer/dot_product_attention.py lines 169-175), so those save a heads' K and V, 2h
    each, not 2h·kv/a: Llama-3-8B's layer at tp 2, seq 4096 had counted 8 MiB of them where
    32 MiB are kept (848 -> 872 MiB a layer). Flash attention and selective recompute (which checkpoints core attention
    at its inputs) keep the kv heads.

    Scores [b, a/t, s, s]: the fused kernel (fused_softmax_available) saves its output, 2 B, the
    dropout 1 B of mask and 2 B of output, Korthikanti's 5·a·s. Where it does not apply,
    forward_torch_softmax (fused_softmax.py lines 313-340, attention_softmax_in_fp32 True)
    casts the scores to fp32, masks them in place and softmaxes: the softmax saves its fp32
    output, 4 B, and its cast back to 16 bits is a new tensor the dropout (or at dropout 0 the
    bmm) reads: 4 + 1 + 2 = 7 B, 4 + 2 = 6 at dropout 0, where 5 and 2 had been counted
    (Llama-3-8B unfused at tp 2, seq 8192, bf16, past the kernel's 4096 keys: 2 GiB of scores a
    layer had been counted where 6 GiB are kept, its layer 2,720 MiB where 6,864 are).
    An fp32 model's: the softmax's output 4 B (masked_fill_ keeps not its output), the mask
    1 B and the dropout's output 4 B (9 B; 4 at dropout 0, the bmm reading the softmax's)."""
    s, b, h, a, t = spec.seq, layout.micro_batch, spec.hidden, spec.heads, layout.tp
    elem = 4.0 if layout.dtype == "fp32" else 2.0
    kv = spec.kv_heads or a
    unfused = spec.attention != "flash" and layout.recompute != "selective"
    k_and_v = h if (unfused and kv < a) else h * kv / a  # elements each, a heads wide once repeated
    qkv_out = elem * (2 * h + 2 * k_and_v + _qkv_output_kept(spec, layout))
    if not unfused:
        return qkv_out / t
    torch_softmax = layout.dtype == "fp32" or not fused_softmax_available(b, a // t, s, spec.causal)
    softmax_out = 4.0 if torch_softmax else elem  # fp32 in torch's softmax, the input's in the kernel
    cast = elem if torch_softmax and layout.dtype != "fp32" else 0.0  # the 16-bit probabilities
    if spec.dropout > 0:
        probs = softmax_out + 1 + elem  # its mask and output; a cast's input dies with the dropout
    else:
        probs = softmax_out + cast  # the bmm reads the cast, or the softmax's own output
    return qkv_out / t + probs * a * s / t


def _qkv_output_kept(spec: GPTSpec, layout: Layout) -> float:
    """Elements a token, before /t, of the QKV GEMM's output [s, b, (a + 2kv)·hd] that V keeps
    alive beyond the Q, K and V attention_bytes_per_token counts. get_query_key_value_tensors
    splits that output into views (megatron-core 0.16.1 transformer/attention.py lines
    1424-1463: view, then SplitAlongDim or torch.split); where V reaches a saved slot as such a
    view, the whole storage stays: in the unfused path without GQA's repeat_interleave (the
    context bmm saves it, dot_product_attention.py line 239) and under selective recompute
    (CheckpointFunction saves its inputs, tensor_parallel/random.py line 528; attention.py
    _checkpointed_attention_forward). Its Q and K parts then add to what is counted wherever
    what is saved for Q or K is a new tensor: rotary positions (models/common/embeddings/
    rope_utils.py lines 122-126, a new tensor from mul, add and cat), the q/k norms, and
    for Q under GQA the reshape at attention.py line 1463 (ng > 1 groups of np/ng heads with
    K and V between them: no view; at one group a rank it is a view). Llama-3-70B (GQA, RoPE) under selective recompute keeps 1.125h
    more than the h + 2h·kv/a it had counted; Phi-3-mini (32 heads, no GQA, RoPE) unfused 2h
    more. Flash attention (Transformer Engine's) is left as counted."""
    h, a = spec.hidden, spec.heads
    kv = spec.kv_heads or a
    if spec.attention == "flash" and layout.recompute != "selective":
        return 0.0
    if layout.recompute != "selective" and kv < a:  # V repeated: a new tensor, the view dies
        return 0.0
    new_qk = spec.rope or spec.qk_norm
    q_copied = kv < a and kv // layout.tp > 1  # one group a rank: the reshape is a view
    return (h if (new_qk or q_copied) else 0.0) + (h * kv / a if new_qk else 0.0)


def edge_activation_bytes(spec: GPTSpec, layout: Layout, stage: int) -> tuple[float, float]:
    """Activations a micro-batch leaves outside the layers, in bytes (Korthikanti et al. 2022,
    beside Table 2: "sbhp/t" for the embedding dropout, "4sbh/t·(1 + v/h)" for the output
    layer): (on the first stage's first chunk, the embedding dropout's mask, s·b·h; on the last
    stage's last chunk, the output layer's 4·s·b·h·(1 + v/h): the final norm's input and the
    LM head's input, 2·s·b·h each, replicated over tp without sequence parallelism, and the
    vocab-parallel loss's fp32 softmax, [b, s, padded vocab / t]). The softmax is the v/h part:
    gpt2's 50,257 are 6,400 a rank at tp 8, not 6,282, as head_forward costs the logits. The
    4·s·b·h had been left out: GPT-3 175B at tp 8, pp 8 under GPipe with 64 micro-batches
    holds 64 x 96 MiB = 6 GiB of them on its last stage, 1F1B one micro-batch's 96 MiB. BERT's
    pretraining heads keep more on the last stage (bert_heads_bytes)."""
    s, b, h, t = spec.seq, layout.micro_batch, spec.hidden, layout.tp
    scale = 2.0 if layout.dtype == "fp32" else 1.0  # the norm's and head's inputs, as activation_bytes_per_layer
    split = t if layout.sequence_parallel else 1
    # the mask is torch's bool dropout mask, 1 byte an element in any dtype (scaling it with the
    # fp32 inputs had made GPT-3 175B's first stage at tp 8, pp 8, 1F1B hold 8 x 48 MiB, not 8 x 24)
    first = s * b * h / split if stage == 0 and spec.dropout > 0 else 0.0  # none at dropout 0
    last = 0.0
    if stage == layout.pp - 1:
        last = scale * 4 * s * b * h / split + b * s * vocab_per_rank(spec.vocab, t) * 4
        last += bert_heads_bytes(spec, layout)
    return first, last


def bert_heads_bytes(spec: GPTSpec, layout: Layout) -> float:
    """What BERT's pretraining heads (GPTSpec.pretraining_heads) save for backward on a rank
    beyond the final norm's and the output layer's inputs, which edge_activation_bytes counts
    as GPT's: megatron-core 0.16.1 runs the final norm's output through BertLMHead's dense,
    gelu and LayerNorm (models/bert/bert_lm_head.py lines 44-49, torch.nn.Linear and
    F.gelu) before the output layer (bert_model.py line 376), so the dense's input is the
    norm's output as GPT's output layer's is, and the gelu's input (the dense's output), the
    LayerNorm's (the gelu's) and the output layer's (the LayerNorm's) are 3 more tensors of
    s·b·h, split over tp with sequence parallelism. The pooler (pooler.py lines 44-52) saves
    hidden_states[0], a view: without sequence parallelism of the final norm's output, held
    already; with it of the [s, b, h] the sequence all-gather returned, which that view keeps
    whole on every rank. Its tanh saves its [b, h] output, the binary head's input. The kit had
    counted GPT's 4·s·b·h: bert-large at seq 512, micro-batch 8 held 24 MiB more than counted."""
    if not spec.pretraining_heads:
        return 0.0
    s, b, h, t = spec.seq, layout.micro_batch, spec.hidden, layout.tp
    elem = 4.0 if layout.dtype == "fp32" else 2.0
    split = t if layout.sequence_parallel else 1
    gathered = s * b * h * elem if layout.sequence_parallel else 0.0  # the pooler's gathered input
    return 3 * s * b * h * elem / split + gathered + b * h * elem


def state_bytes(layout: Layout) -> tuple[int, int, int]:
    """Bytes a parameter of (weights, gradients, optimizer state) before ZeRO's sharding. The
    optimizer state is Adam's fp32 momentum and variance (8), the fp32 master weights of a
    16-bit model (+4), and the fp32 copy of 16-bit gradients the step reads (+4; fp32 gradients
    are stepped in place): Megatron-LM's 20 / 18 / 16 B (fp16 / bf16 with fp32 grads / fp32)."""
    master = 0 if layout.dtype == "fp32" else 4
    main_grad = 0 if layout.grad_dtype == "fp32" else 4
    return layout.weight_bytes, layout.grad_bytes, 8 + master + main_grad


def memory_per_rank(spec: GPTSpec, layout: Layout, gpu=None) -> list[dict]:
    """One row per pipeline stage (all ranks of a stage hold the same), sizes in GiB."""
    w_b, g_b, o_b = state_bytes(layout)
    rows = []
    chunks = stage_layers(spec, layout)
    for stage in range(layout.pp):
        p, e = local_params(spec, layout, stage), local_expert_params(spec, layout, stage)
        weights, grads, optim = (zero_kept(p, e, layout, z_from) * nbytes
                                 for nbytes, z_from in ((w_b, 3), (g_b, 2), (o_b, 1)))
        per_chunk = [sum(activation_bytes_per_layer(spec, layout, layer)
                         for layer in chunks[c * layout.pp + stage])
                     for c in range(layout.virtual_stages)]
        first, last = edge_activation_bytes(spec, layout, stage)
        per_chunk[0] += first
        per_chunk[-1] += last
        live = in_flight(layout.schedule, stage, layout.pp, layout.micro_batches,
                         layout.virtual_stages)
        # the peak of the schedule's walk, each pass holding its own chunk's bytes: max(chunk)
        # x live had counted every pass in flight as the largest chunk (18 layers with MoE every
        # 2nd at pp 3 x 2 virtual stages: stage 0's chunks hold 1 and 2 MoE layers)
        acts = peak_held(layout.schedule, stage, layout.pp, layout.micro_batches,
                         layout.virtual_stages, per_chunk)
        if layout.recompute == "full":  # one layer is rematerialised in full during backward
            acts += max(activation_bytes_per_layer(spec, layout.with_(recompute="none"), layer)
                        for c in range(layout.virtual_stages) for layer in chunks[c * layout.pp + stage])
        total = weights + grads + optim + acts
        row = {"stage": stage, "ranks": layout.dp * layout.tp, "params": p,
               "weights_gib": weights / GIB, "grads_gib": grads / GIB, "optimizer_gib": optim / GIB,
               "activations_gib": acts / GIB, "total_gib": total / GIB,
               "in_flight_microbatches": live}
        if gpu is not None:
            row["gpu_memory_gib"] = gpu.memory_gib
            row["gpu_usable_memory_gib"] = gpu.usable_memory_gib  # less in-band ECC (GDDR cards)
            row["fits"] = total / GIB <= gpu.usable_memory_gib
        rows.append(row)
    return rows
