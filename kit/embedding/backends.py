"""The timed calls of the embedding collector (kit.embedding.collect), one per backend: "torch"
(nn.EmbeddingBag, one per table, cpu or cuda) and "fbgemm" (FBGEMM's fused table-batched
embedding, cuda only). Each call reads the next of its pre-drawn index sets (drawn from one seeded
stream, at most INDEX_BUDGET bytes of them, cycled); a backward row's forward runs outside the
timed call. fbgemm tables are held in the row's dtype (weights_precision) and return it
(output_dtype).
"""
from __future__ import annotations

import numpy as np

from kit.embedding.distributions import parse_distribution
from kit.errors import KitError

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
INDEX_BUDGET = 1 << 30  # bytes of pre-drawn index sets at most (int64 indices)


def _fbgemm():
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    except ImportError:
        return None
    return (EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen, SparseType)


def _precision(dtype: str, sparse_type) -> dict:
    """fbgemm's TBE keyword arguments for a row dtype: tables held in it and output in it."""
    t = {"fp32": sparse_type.FP32, "fp16": sparse_type.FP16, "bf16": sparse_type.BF16}[dtype]
    return {"weights_precision": t, "output_dtype": t}


def n_index_sets(cfg: dict, wanted: int) -> int:
    """How many index sets to draw: one per call (`wanted`), at most INDEX_BUDGET bytes of them."""
    per_set = 8 * cfg["batch"] * cfg["pooling"] * cfg["tables"]
    return max(1, min(wanted, INDEX_BUDGET // max(per_set, 1)))


def _inputs(cfg, device):
    """(index sets, offsets, mean unique rows): cfg["_sets"] sets (default 1), each a list of one
    index tensor per table, drawn from one seeded stream."""
    import torch

    rng = np.random.default_rng(1234 + cfg["rows"] + cfg["batch"])
    dist = parse_distribution(cfg.get("_dist", cfg["distribution"]))  # a config built by hand: its spec
    n = cfg["batch"] * cfg["pooling"]
    sets, uniques = [], []
    for _ in range(int(cfg.get("_sets", 1))):
        idx = [dist.sample(n, cfg["rows"], rng) for _ in range(cfg["tables"])]
        uniques += [np.unique(i).size for i in idx]
        sets.append([torch.from_numpy(i).to(device) for i in idx])
    offsets = torch.arange(0, n + 1, cfg["pooling"], dtype=torch.int64, device=device)
    return sets, offsets, float(np.mean(uniques))


class _Rotor:
    """The index set of the next call: advance() (outside the timed region) moves to the next."""

    def __init__(self, sets):
        self.sets, self.i = sets, 0

    def advance(self):
        self.i = (self.i + 1) % len(self.sets)

    @property
    def cur(self):
        return self.sets[self.i]


def _torch_call(cfg, device):
    """(call, unique rows, before): before() runs outside the timed region before each call:
    it moves to the next index set and, for a backward row, runs the forward."""
    import torch

    if cfg["pass"] == "backward" and cfg["optimizer"] not in ("", "sgd"):  # "" is sgd, as collect and fbgemm read it
        raise KitError(f"optimizer {cfg['optimizer']!r} needs the fbgemm backend; torch does sgd")
    dtype = getattr(torch, TORCH_DTYPES[cfg["dtype"]])
    bags = [torch.nn.EmbeddingBag(cfg["rows"], cfg["dim"], mode=cfg["mode"], sparse=True,
                                  dtype=dtype, device=device) for _ in range(cfg["tables"])]
    sets, offsets, unique = _inputs(cfg, device)
    rotor = _Rotor(sets)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                for bag, i in zip(bags, rotor.cur):
                    bag(i, offsets[:-1])
        return call, unique, rotor.advance
    opt = torch.optim.SGD([p for b in bags for p in b.parameters()], lr=0.01)
    outs: list = []
    grad = torch.ones(cfg["batch"], cfg["dim"], dtype=dtype, device=device)

    def before():
        rotor.advance()
        outs[:] = [bag(i, offsets[:-1]) for bag, i in zip(bags, rotor.cur)]

    def call():  # backward + update only: the forward ran in before()
        for out in outs:
            out.backward(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        outs.clear()
    return call, unique, before


def _fbgemm_call(cfg, device):
    import torch

    fb = _fbgemm()
    if fb is None:
        raise KitError("the fbgemm backend needs fbgemm_gpu installed (pip install fbgemm-gpu)")
    if device != "cuda":
        raise KitError("the fbgemm backend runs on cuda only")
    EmbOptimType, EmbeddingLocation, PoolingMode, ComputeDevice, TBE, SparseType = fb
    optim = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
             "": EmbOptimType.EXACT_SGD}[cfg["optimizer"]]
    specs = [(cfg["rows"], cfg["dim"], EmbeddingLocation.DEVICE, ComputeDevice.CUDA)] * cfg["tables"]
    tbe = TBE(specs, optimizer=optim, learning_rate=0.01,
              pooling_mode=PoolingMode.SUM if cfg["mode"] == "sum" else PoolingMode.MEAN,
              **_precision(cfg["dtype"], SparseType))
    sets, _, unique = _inputs(cfg, device)
    rotor = _Rotor([torch.cat(ind) for ind in sets])
    n = cfg["batch"] * cfg["pooling"]
    offsets = torch.arange(0, n * cfg["tables"] + 1, cfg["pooling"], dtype=torch.int64, device=device)
    if cfg["pass"] == "forward":
        def call():
            with torch.no_grad():
                tbe(rotor.cur, offsets)
        return call, unique, rotor.advance
    dtype = getattr(torch, TORCH_DTYPES[cfg["dtype"]])
    grad = torch.ones(cfg["batch"], cfg["dim"] * cfg["tables"], dtype=dtype, device=device)
    outs: list = []

    def before():
        rotor.advance()
        outs[:] = [tbe(rotor.cur, offsets)]

    def call():  # the fused backward applies the optimizer; the forward ran in before()
        outs.pop().backward(grad)
    return call, unique, before

