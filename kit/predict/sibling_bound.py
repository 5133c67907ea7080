"""A GPU is never slower than a training GPU it dominates: the same SM design (architecture,
lanes, shared memory, registers, thread and block limits, L1) with at least as many SMs and at
least its clock, bandwidth, L2, power limit and every peak. The tile-MLP's GPU features include
the power limit over the peak, so a card it never saw could come out slower than the training
card it outdoes in everything: an A100-SXM4-40GB (400 W) under the A100-PCIe-40GB (250 W, a
training GPU) on a 2-layer LSTM by 32%, a Linear of 8 tokens by 31%. In NeuSight's test data the
A100 80GB PCIe (300 W) ran the same GEMMs 9-11% faster than the A100 PCIe 40GB (250 W) at every
kernel length, as a higher power limit lets it."""
from __future__ import annotations

from kit.hardware import GPU, get_gpu

SAME_SM = ("vendor", "arch", "fp32_lanes_per_sm", "smem_per_sm_kib", "registers_per_sm",
           "max_threads_per_sm", "max_blocks_per_sm", "l1_cache_kib_per_sm")
AT_LEAST = ("sm_count", "boost_clock_mhz", "mem_bw_gbs", "l2_cache_mib", "tdp_w", "fp32_tflops",
            "tf32_tflops", "fp16_tflops", "bf16_tflops", "fp8_tflops", "fp32_matrix_tflops")


def dominates(gpu: GPU, other: GPU) -> bool:
    """gpu has other's SM design and at least each of its resources (a peak other lacks is free).
    Not itself, by spec rather than key: a catalog card's dataclasses.replace under its own key
    (an A100-PCIe-40GB at 400 W) is another card."""
    if gpu == other or any(getattr(gpu, f) != getattr(other, f) for f in SAME_SM):
        return False
    for f in AT_LEAST:
        mine, theirs = getattr(gpu, f), getattr(other, f)
        if theirs is not None and (mine is None or mine < theirs):
            return False
    return True


def dominated_training_gpus(gpu: GPU | str, train_gpus) -> list[GPU]:
    """The training GPUs gpu dominates (none for a training GPU itself: its own rows set it).
    A training GPU is the spec trained on, not its key: an A100-PCIe-40GB object at 400 W (a
    dataclasses.replace, not registered) had been taken for the training card, left unbounded
    and come out slower than it on 216 of 263 ops (up to 2.46x). A --gpu-file that replaces a
    training GPU's spec is that training GPU still (get_gpu gives the replacement)."""
    gpu = get_gpu(gpu)
    trained = [get_gpu(g) for g in (train_gpus or ())]
    if gpu in trained:
        return []
    return [t for t in trained if dominates(gpu, t)]


def bounding_gpus(model, gpu: GPU) -> tuple:
    """The GPUs whose predictions bound model's on gpu (a tile predictor's dominated training
    GPUs; none for a predictor without the bound): what a cache of its answers on gpu must be
    keyed by beside gpu's own spec, since a --gpu-file may replace one of them."""
    return tuple(getattr(model, "dominated_training_gpus", lambda _: ())(gpu))


def runs_dtype(gpu: GPU, op) -> bool:
    """Whether gpu has a peak for op's dtype (an op of none, a host copy, every GPU runs): a
    dominated GPU bounds only the ops it can run, since a peak the weaker card lacks is free to
    dominate it."""
    return getattr(op, "dtype", None) in (None, *gpu.dtypes)
