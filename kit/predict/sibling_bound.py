"""A GPU is never slower than a training GPU it dominates: the same SM design (architecture,
lanes, shared memory, registers, thread and block limits, L1) with at least as many SMs and at
least its clock, bandwidth, L2, power limit and every peak. The tile-MLP's GPU features include
the power limit over the peak, so a card it never saw could come out slower than the training
card it outdoes in everything: an A100-SXM4-40GB (400 W) under the A100-PCIe-40GB (250 W, a
training GPU) on a 2-layer LSTM by 32%, a Linear of 8 tokens by 31%. In NeuSight's test data the
A100 80GB PCIe (300 W) ran the same GEMMs 9-11% faster than the A100 PCIe 40GB (250 W) at every
kernel length, as a higher power limit lets it.

Among GPUs none of which was trained on, the same features ordered the cards of one SM design at
random: over 287 ops on the catalog's 31 dominance pairs the stronger card came out more than 1%
slower in 1,213 of 7,925 comparisons (a GH200 at 1.97x the H100 NVL's time on an fp32
Gemm(2385, 5, 2048), an MI210 at 1.14x the MI250 GCD's on a Linear). So the tile-MLP's learned
answer on a GPU, before that GPU's own bounds and measured curves, is the least of its own and
those on every catalog GPU it dominates (dominated_gpus; TilePredictor._predict_class): 77
comparisons left, all but three under 5%, where a GPU's own bounds (its dispatch floor, element
rates) differ. Bounding the final answers by every such GPU's instead had carried one GPU's
bounds to another (a raised dispatch floor, the H200's curves), broken nine tests of them and
made benchmarks/h200_measured.py 3.3x slower; this is 2x there (each learned answer of a GPU
that dominates three is computed four times)."""
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


def dominated_gpus(gpu: GPU | str, train_gpus) -> list[GPU]:
    """The catalog GPUs gpu dominates (a --gpu-file's included), whose learned answers bound its
    own (TilePredictor._predict_class); none for a training GPU itself."""
    from kit.hardware import list_gpus

    gpu = get_gpu(gpu)
    if gpu in [get_gpu(g) for g in (train_gpus or ())]:
        return []
    return [g for g in list_gpus() if dominates(gpu, g)]


def bounding_gpus(model, gpu: GPU) -> tuple:
    """The GPUs whose predictions bound model's on gpu (a tile predictor's dominated training
    GPUs, then the catalog GPUs whose learned answers bound its own; none for a predictor without
    the bound): what a cache of its answers on gpu must be keyed by beside gpu's own spec, since
    a --gpu-file may replace one of them."""
    trained = list(getattr(model, "dominated_training_gpus", lambda _: ())(gpu))
    learned = getattr(model, "learned_bound_gpus", lambda _: ())(gpu)
    return tuple(trained + [g for g in learned if g not in trained])
