"""BERT in the multi-GPU layer: its token-type table and its pretraining heads (the pooler, the MLM
transform with its LayerNorm, the decoder's vocab-wide bias, next-sentence prediction), which
the layer had left out of its parameters (bert-base 108,890,112 where HF's BertForPreTraining
has 110,106,428, 1.1% short). Expected values are HF's module's own parameter counts (taken once
from transformers 5.25, BertForPreTraining built on the meta device, and re-derived here by hand
from the config), and torch's count of that module where transformers is installed."""
import pytest

from kit.parallel import Layout, parse_model
from kit.parallel.memory import local_params

# sum(p.numel() for p in BertForPreTraining(BertConfig(...)).parameters()), transformers 5.25
HF_PRETRAINING = {"bert-base": 110_106_428, "bert-large": 336_226_108}
SHAPES = {"bert-base": (768, 12, 3072), "bert-large": (1024, 24, 4096)}


def _by_hand(h: int, layers: int, f: int, vocab: int = 30522, positions: int = 512, types: int = 2) -> int:
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h  # q, k, v, o; MLP; two LayerNorms
    embeddings = (vocab + positions + types) * h + 2 * h  # and their LayerNorm
    pooler = h * h + h
    mlm = (h * h + h) + 2 * h + vocab  # transform, its LayerNorm, the decoder's bias (weight tied)
    nsp = 2 * h + 2
    return layers * layer + embeddings + pooler + mlm + nsp


@pytest.mark.parametrize("name", ["bert-base", "bert-large"])
def test_berts_parameters_are_hf_bert_for_pretrainings(name):
    h, layers, f = SHAPES[name]
    assert _by_hand(h, layers, f) == HF_PRETRAINING[name]  # the hand formula is HF's count
    assert parse_model(name).params == HF_PRETRAINING[name]


def test_torch_counts_hf_bert_for_pretraining_as_the_spec_does():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    for name, (h, layers, f) in SHAPES.items():
        cfg = transformers.BertConfig(hidden_size=h, num_hidden_layers=layers,
                                      num_attention_heads=h // 64, intermediate_size=f)
        with torch.device("meta"):
            n = sum(p.numel() for p in transformers.BertForPreTraining(cfg).parameters())
        assert parse_model(name).params == n


def test_a_rank_holds_the_heads_as_megatron_core_builds_them():
    """megatron-core 0.16.1: the token-type table (common/embeddings/language_model_embedding.py
    76, a torch Embedding), the pooler (models/bert/pooler.py 33), the LM head's dense and
    LayerNorm (bert_lm_head.py 31) and the binary head (bert_model.py 154) are whole on every TP
    rank; the output layer's bias is ColumnParallelLinear's (bert_model.py 140-146), split with
    the padded vocabulary (30522 -> 30720 at tp 2: 15,360 a rank)."""
    bert = parse_model("bert-base")
    bare = parse_model("gpt:layers=12,hidden=768,heads=12,seq=512,vocab=30522,ffn=3072,positions=512")
    h = 768
    for pp in (1, 2):
        lay = Layout(tp=2, pp=pp, micro_batch=1, global_batch=1)
        first = local_params(bert, lay, 0) - local_params(bare, lay, 0)
        last = local_params(bert, lay, pp - 1) - local_params(bare, lay, pp - 1)
        heads = 2 * (h * h + h) + 2 * h + (2 * h + 2) + 15360
        if pp == 1:
            assert first == 2 * h + heads
        else:
            assert (first, last) == (2 * h, heads)


def test_inline_shapes_take_bert_heads_and_refuse_a_bad_count():
    from kit.errors import KitError

    s = parse_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,token_types=2,pretraining_heads=1")
    plain = parse_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100")
    assert s.params - plain.params == 2 * 64 + 2 * (64 * 64 + 64) + 2 * 64 + 100 + 2 * 64 + 2
    assert "token_types" not in plain.to_dict() and s.to_dict()["pretraining_heads"] is True
    with pytest.raises(KitError, match="token_types"):
        parse_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,token_types=-1")


def test_the_step_runs_berts_heads_and_token_type_lookup():
    """The heads' kernels, as megatron-core 0.16.1 runs them: the LM head's h x h dense on every
    token, gelu and LayerNorm (bert_lm_head.py), the pooler's h x h dense and tanh on each
    sequence's first token, the binary head's h x 2 (pooler.py, bert_model.py), the output
    layer's bias added after the logits GEMM and its gradient summed over the tokens
    (tensor_parallel/layers.py 488-490, 615); each GEMM's data and weight gradients backward;
    the token-type lookup (language_model_embedding.py 122-126)."""
    from kit import ops
    from kit.parallel.gpt import embedding_forward, head_backward, head_forward

    bert, bare = parse_model("bert-base", seq=512), parse_model(
        "gpt:layers=12,hidden=768,heads=12,seq=512,vocab=30522,ffn=3072,positions=512")
    b, tp, h, tok = 4, 2, 768, 4 * 512
    v = 15360  # 30522 padded to 30720 at tp 2, a rank's half

    def gemms(blocks):
        return sorted((o.m, o.n, o.k) for blk in blocks for o in blk.ops if isinstance(o, ops.Gemm))

    def extra(a, z):  # what a has beyond z, as a multiset
        out = list(a)
        for x in z:
            out.remove(x)
        return sorted(out)

    for sp in (False, True):
        rows = tok // tp if sp else tok
        fwd = [head_forward(s, b, tp, "bf16", sp) for s in (bert, bare)]
        assert extra(gemms(fwd[0]), gemms(fwd[1])) == sorted([(rows, h, h), (b, h, h), (b, 2, h)])
        bwd = [head_backward(s, b, tp, "bf16", sp) for s in (bert, bare)]
        assert extra(gemms(bwd[0]), gemms(bwd[1])) == sorted(
            [(rows, h, h), (h, h, rows), (b, h, h), (h, h, b), (b, h, 2), (h, 2, b)])
        kinds = [o.kind for blk in fwd[0] for o in blk.ops if isinstance(o, ops.Elementwise)]
        bare_kinds = [o.kind for blk in fwd[1] for o in blk.ops if isinstance(o, ops.Elementwise)]
        assert extra(kinds, bare_kinds) == sorted(["gelu", "tanh", "add"])
        adds = [o for blk in fwd[0] for o in blk.ops if isinstance(o, ops.Elementwise) and o.kind == "add"]
        assert [o.numel for o in adds] == [tok * v]
        assert sum(isinstance(o, ops.LayerNorm) for blk in fwd[0] for o in blk.ops) == 2
        # the bias's gradient: one pass over the [tokens, vocab / tp] gradient, a row of bf16 out
        nbytes = [[o.bytes for blk in x for o in blk.ops] for x in bwd]
        assert extra(nbytes[0], nbytes[1]).count(float((tok * v + v) * 2)) == 1
    emb = [o for blk in embedding_forward(bert, b, tp, "bf16") for o in blk.ops if isinstance(o, ops.EmbeddingBag)]
    assert [(o.batch, o.rows, o.dim) for o in emb] == [(tok, v, h), (tok, 2, h)]


@pytest.mark.parametrize("bad", [0, -1, "2", True, 1.5])
def test_a_bert_config_with_a_bad_type_vocab_size_is_refused(tmp_path, bad):
    import json

    from kit.errors import KitError

    c = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 256, "vocab_size": 100, "max_position_embeddings": 64,
         "type_vocab_size": bad}
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(c))
    with pytest.raises(KitError, match="type_vocab_size must be a positive whole number"):
        parse_model(str(path), seq=16)
    path.write_text(json.dumps({**c, "type_vocab_size": 3}))
    assert parse_model(str(path), seq=16).token_types == 3


def test_berts_attention_is_bidirectional_and_a_gpts_stays_causal():
    """megatron-core 0.16.1 builds BERT's attention with AttnMaskType.padding
    (models/bert/bert_layer_specs.py 64, 103; bert_model.py 201-213): every query sees every key
    of its sequence. The analytic layer had built it causal, half the score pairs. Expected
    FLOPs by hand: Q.K^T and P.V, 2 FLOPs a multiply-add over head 64 each, for every one of the
    512 x 512 pairs (BERT) or the 512 x 513 / 2 of the triangle (GPT), 12 / 2 heads a rank."""
    from kit import ops
    from kit.errors import KitError
    from kit.parallel.gpt import layer_forward

    bert = parse_model("bert-base", seq=512)
    gpt = parse_model("gpt:layers=12,hidden=768,heads=12,seq=512,vocab=30522,ffn=3072,positions=512")
    for spec, pairs in ((bert, 512 * 512), (gpt, 512 * 513 // 2)):
        attn = [o for blk in layer_forward(spec, 4, 2, 1, False, "bf16") for o in blk.ops
                if isinstance(o, ops.Attention)]
        assert len(attn) == 1 and attn[0].causal is (spec is gpt)
        assert attn[0].flops == 2 * 4 * 6 * pairs * (64 + 64)
    # a sliding window is a causal band: refused on a bidirectional spec, naming both keys
    with pytest.raises(KitError, match="window.*pretraining_heads"):
        parse_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,window=8,pretraining_heads=1")
