"""What runs on a GPU, and how much work it is: FLOPs and bytes moved, with no GPU in sight.

Conventions
-----------
* GEMM: C[b, m, n] = A[b, m, k] · B[b, k, n]; k is the reduction dimension, FLOPs = 2·b·m·n·k.
  (NeuSight names the reduction N: its (B, M, N, K) is the kit's (b, m, k, n).)
* Bytes are the minimum DRAM traffic: every input read once and every output written once.
* Vector ops act on a (rows, cols) view; softmax and the norms reduce over cols.
* Bytes per dtype, FLOPs per element and the dimension checks: kit.op_counts.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from kit.errors import KitError, yes_no
from kit.numpy_free import is_bool
from kit.op_counts import (BINARY_KINDS, DROPOUT_FLOPS_PER_ELEM, ELEMENTWISE_FLOPS, GEMM_KINDS,
                           LAYERNORM_FLOPS_PER_ELEM, MAX_ALIGN_ELEMS, RMSNORM_FLOPS_PER_ELEM,
                           SOFTMAX_FLOPS_PER_ELEM, TERNARY_KINDS, _positive_ints, dtype_bytes,
                           lead_alignment)
from kit.op_counts import DTYPE_BYTES  # noqa: F401 (re-exported: its importers take it from here)


@dataclass(frozen=True)
class Gemm:
    """A (batched) matrix multiply. `shared_rhs`: B is one weight shared over the batch (Linear).
    `align`: lead_alignment of the leading dimensions of its operands as laid out in memory (the
    capture reads them off the strides: a weight gradient's transposed operand leads with m; a
    measured Linear or bmm row leads with n and k); None: aligned (the analytic layers, a
    convolution's implicit GEMM, which the libraries pad)."""

    m: int
    n: int
    k: int
    b: int = 1
    dtype: str = "fp32"
    kind: str = "bmm"  # "bmm" | "linear" | "mm"
    shared_rhs: bool = False
    align: int | None = None
    op_class = "gemm"

    def __post_init__(self):
        if self.kind not in GEMM_KINDS:
            raise KitError(f"gemm kind {self.kind!r}: choose one of {', '.join(GEMM_KINDS)}")
        if not is_bool(self.shared_rhs):
            raise KitError(f"{self.kind}: shared_rhs must be True or False, got {self.shared_rhs!r}")
        _positive_ints(self.kind, self, b=self.b, m=self.m, n=self.n, k=self.k)
        dtype_bytes(self.dtype)
        if self.align is not None:
            _positive_ints(self.kind, self, align=self.align)
            if self.align != lead_alignment(self.align):
                raise KitError(f"{self.kind}: align must be 1, 2, 4 or {MAX_ALIGN_ELEMS}, got {self.align!r}")

    @property
    def lead_align(self) -> int:
        """The alignment (elements) of its leading dimensions: `align`, else MAX_ALIGN_ELEMS."""
        return self.align if self.align is not None else MAX_ALIGN_ELEMS

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        rhs = self.k * self.n * (1 if self.shared_rhs else self.b)
        return float(dtype_bytes(self.dtype) * (self.b * self.m * self.k + rhs + self.b * self.m * self.n))


def linear(tokens: int, in_features: int, out_features: int, dtype: str = "fp32") -> Gemm:
    """nn.Linear(in_features, out_features) applied to `tokens` rows."""
    return Gemm(m=tokens, n=out_features, k=in_features, b=1, dtype=dtype, kind="linear",
                shared_rhs=True)


@dataclass(frozen=True)
class Elementwise:
    """y = f(x) or y = f(x1, x2) over numel elements. `inputs` = tensors read (scalar forms: 1).
    `vectorized`: False where PyTorch cannot take its vectorized kernel (an input broadcast,
    a 0-dim tensor on the device among them, or not contiguous): the generic kernel computes
    every element's offsets and is limited by that, not by the bytes (kit.workload.iteration)."""

    kind: str
    numel: int
    dtype: str = "fp32"
    inputs: int | None = None
    vectorized: bool = True
    op_class = "elementwise"

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in ELEMENTWISE_FLOPS:
            raise KitError(f"unknown elementwise kind {self.kind!r}: choose one of "
                           + ", ".join(sorted(ELEMENTWISE_FLOPS)))
        _positive_ints(f"elementwise {self.kind}", self, numel=self.numel)
        dtype_bytes(self.dtype)
        if self.inputs is not None:
            _positive_ints(f"elementwise {self.kind}", self, inputs=self.inputs)
        if not is_bool(self.vectorized):
            raise KitError(f"elementwise {self.kind}: vectorized must be True or False, got {self.vectorized!r}")

    @property
    def n_inputs(self) -> int:
        if self.inputs is not None:
            return self.inputs
        return 3 if self.kind in TERNARY_KINDS else 2 if self.kind in BINARY_KINDS else 1

    @property
    def flops(self) -> float:
        return float(ELEMENTWISE_FLOPS[self.kind] * self.numel)

    @property
    def bytes(self) -> float:
        return float(dtype_bytes(self.dtype) * self.numel * (self.n_inputs + 1))


@dataclass(frozen=True)
class _RowOp:
    rows: int
    cols: int
    dtype: str = "fp32"
    flops_per_elem = 0
    extra_bytes_per_col = 0  # parameters read once (weight, bias)

    def __post_init__(self):
        _positive_ints(self.op_class, self, rows=self.rows, cols=self.cols)
        dtype_bytes(self.dtype)

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def flops(self) -> float:
        return float(self.flops_per_elem * self.numel)

    @property
    def bytes(self) -> float:
        d = dtype_bytes(self.dtype)
        return float(d * (2 * self.numel + self.extra_bytes_per_col * self.cols))


@dataclass(frozen=True)
class Softmax(_RowOp):
    """Softmax over the last dim of a (rows, cols) view: read once, write once."""

    op_class = "softmax"
    flops_per_elem = SOFTMAX_FLOPS_PER_ELEM


@dataclass(frozen=True)
class LayerNorm(_RowOp):
    """LayerNorm over cols with weight and bias."""

    op_class = "layernorm"
    flops_per_elem = LAYERNORM_FLOPS_PER_ELEM
    extra_bytes_per_col = 2


@dataclass(frozen=True)
class RMSNorm(_RowOp):
    """RMSNorm over cols with a weight."""

    op_class = "rmsnorm"
    flops_per_elem = RMSNORM_FLOPS_PER_ELEM
    extra_bytes_per_col = 1


@dataclass(frozen=True)
class Dropout:
    """Training-mode dropout: reads x, writes y and a one-byte mask."""

    numel: int
    dtype: str = "fp32"
    p: float = 0.1
    op_class = "dropout"

    def __post_init__(self):
        _positive_ints("dropout", self, numel=self.numel)
        dtype_bytes(self.dtype)
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0 <= self.p < 1:
            raise KitError(f"dropout: p must be a number in [0, 1), got {self.p!r}")

    @property
    def flops(self) -> float:
        return float(DROPOUT_FLOPS_PER_ELEM * self.numel)

    @property
    def bytes(self) -> float:
        return float(self.numel * (2 * dtype_bytes(self.dtype) + 1))


@dataclass(frozen=True)
class EmbeddingBag:
    """Pooled lookup: `batch` bags of `pooling` rows each from a (rows, dim) table (sum/mean).

    Basic cost: every looked-up row is read from DRAM (no cache reuse; kit.embedding models
    the index distribution), int64 indices are read, one pooled row per bag is written.
    """

    batch: int
    rows: int
    dim: int
    pooling: int
    dtype: str = "fp32"
    mode: str = "sum"
    op_class = "embedding"

    def __post_init__(self):
        _positive_ints("embedding_bag", self, batch=self.batch, rows=self.rows, dim=self.dim,
                       pooling=self.pooling)
        dtype_bytes(self.dtype)
        if self.mode not in ("sum", "mean"):
            raise KitError(f"embedding_bag: mode must be 'sum' or 'mean', got {self.mode!r}")

    @property
    def lookups(self) -> int:
        return self.batch * self.pooling

    @property
    def table_bytes(self) -> float:
        """The (rows, dim) table, which must sit in device memory however few rows are read."""
        return float(self.rows * self.dim * dtype_bytes(self.dtype))

    @property
    def flops(self) -> float:
        extra = self.batch * self.dim if self.mode == "mean" else 0
        return float(self.lookups * self.dim + extra)

    @property
    def bytes(self) -> float:
        d = dtype_bytes(self.dtype)
        return float(self.lookups * self.dim * d + self.lookups * 8 + self.batch * self.dim * d)


# the query rows and keys of one tile of the flash kernels the attention curve was fitted on:
# cuDNN's sm90 flash fprop, "..._64x128x128_..." (head 128) and "..._64x128x64_..." (head 64) in
# measurements/h200-2026-12-04-b/session/attention_bf16.jsonl, causal or not (other GPUs' and
# libraries' flash kernels may tile otherwise; the carried curves assume these)
FLASH_TILE_Q = 64
FLASH_TILE_KV = 128


def _causal_pairs(q: int, kv: int) -> float:
    """(i, j) with j <= i, 0 <= i < q, 0 <= j < kv: the pairs top-left causal attention keeps."""
    return q * (q + 1) / 2 if q <= kv else kv * (kv + 1) / 2 + (q - kv) * kv


def band_tiles(window: int, tile_q: int = FLASH_TILE_Q, tile_kv: int = FLASH_TILE_KV) -> float:
    """Key tiles a query tile past the first window visits in a sliding-window band: rows
    a .. a + tile_q - 1 see keys a - window + 1 .. a + tile_q - 1, so tiles
    floor((a + tile_q - 1) / tile_kv) - floor((a - window + 1) / tile_kv) + 1, averaged over the
    offsets a mod tile_kv a query tile starts at (0, tile_q, ...): 33 for 4096 at 64 x 128,
    about ceil(window / tile) + 1 (a causal query tile i visits about i + 1)."""
    starts = range(0, tile_kv, tile_q) if tile_kv % tile_q == 0 else range(tile_kv)
    n = [(a + tile_q - 1) // tile_kv - (a - window + 1) // tile_kv + 1 for a in starts]
    return sum(n) / len(n)


@dataclass(frozen=True)
class Attention:
    """Fused scaled-dot-product attention (flash-style): Q·Kᵀ, softmax, ·V without storing scores."""

    b: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    dtype: str = "fp32"
    causal: bool = False
    kv_heads: int | None = None
    v_head_dim: int | None = None  # the values' head size where it is not q/k's (DeepSeek's MLA)
    # an additive or boolean mask's bytes (attn_mask): read by the kernel, each of its elements
    # once (a dim it broadcasts over, as (b, 1, s, s) over the heads, counted once)
    mask_bytes: int = 0
    # a causal sliding window (Mistral's sliding_window): the keys a query sees, itself
    # included, i - window < j <= i (flash-attn's and Transformer Engine's window_size
    # (window - 1, 0)); 0: none. Flash attention skips the key blocks outside the band, so its
    # work is the band's pairs, about seq_q x window, not the causal triangle's seq_q^2 / 2
    window: int = 0
    op_class = "attention"

    def __post_init__(self):
        _positive_ints("attention", self, b=self.b, heads=self.heads, seq_q=self.seq_q,
                       seq_kv=self.seq_kv, head_dim=self.head_dim)
        dtype_bytes(self.dtype)
        object.__setattr__(self, "causal", yes_no(self.causal, "attention: causal"))
        if self.kv_heads is not None:  # grouped-query: each K/V head serves heads / kv_heads queries
            _positive_ints("attention", self, kv_heads=self.kv_heads)
            if self.heads % self.kv_heads:
                raise KitError(f"attention: kv_heads {self.kv_heads} must divide heads {self.heads}")
        if self.v_head_dim is not None:
            _positive_ints("attention", self, v_head_dim=self.v_head_dim)
        if self.mask_bytes:  # 0: no mask
            _positive_ints("attention", self, mask_bytes=self.mask_bytes)
        if self.window:  # 0: no window
            _positive_ints("attention", self, window=self.window)
            if not self.causal:
                raise KitError(f"attention: a sliding window ({self.window}) is a causal band; "
                               "give causal=True with it")

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def causal_fraction(self) -> float:
        """The share of (query, key) pairs a causal mask keeps: 1 without one. PyTorch's is_causal
        aligns the mask top-left (torch.nn.functional.scaled_dot_product_attention docs): query i
        (from 1) sees keys 1..min(i, seq_kv), so seq_q = seq_kv keeps (L + 1) / 2L, a bit over half.
        A sliding window w takes away the pairs j <= i - w: the causal pairs of the queries from
        w on, shifted back by w (queries 1..seq_q - w over the same keys); seq_q = seq_kv = L >= w
        keeps L·w - w(w - 1)/2 pairs."""
        if not self.causal:
            return 1.0

        q, kv, pairs = self.seq_q, self.seq_kv, _causal_pairs
        band = pairs(q, kv) - (pairs(q - self.window, kv) if 0 < self.window < q else 0.0)
        return band / (q * kv)

    def causal_scale(self, causal_factor: float) -> float:
        """The multiplier a fitted causal factor (kit.predict.tensor_core's causal_factor) puts on
        this op's time: 1 without a mask, the factor for the causal triangle. The factor was fitted
        on square causal shapes, whose query tile i visits the key tiles up to its diagonal, rows
        of 1..n tiles each ending in a partly masked one; what a causal triangle costs past its
        pairs (that tile, rows too short to hide their start and end, unequal rows) is its. A
        sliding window w keeps that triangle for its first w queries alone; every query from w on
        sees w keys, its query tile FLASH_TILE_Q rows over band_tiles(w) key tiles of
        FLASH_TILE_KV: rows of one length, a non-causal attention over those tiles (factor 1),
        dearer than its pairs only by its partly masked tiles at both ends. So a band takes the
        factor on the triangle's pairs and band_tiles x tile / pairs on the rest. Applying the
        whole factor to the band had priced Mistral's 32k x 4096 band 1.236x its tiles, some
        18% over (the band is 93% rows of equal length)."""
        if not self.causal:
            return 1.0
        q, kv, w = self.seq_q, self.seq_kv, self.window
        if not 0 < w < q:
            return causal_factor
        band = self.causal_fraction * q * kv
        triangle = _causal_pairs(w, kv)  # queries 0 .. w - 1 see keys 0 .. i
        rows = band - triangle  # from w on, w keys each (fewer only past seq_kv)
        tiles_per_pair = band_tiles(w) * FLASH_TILE_KV / w
        return (triangle * causal_factor + rows * tiles_per_pair) / band

    @property
    def flops(self) -> float:
        # Q·Kᵀ contracts over q/k's head size, P·V over the values' (2 FLOPs a multiply-add each)
        full = 2.0 * self.b * self.heads * self.seq_q * self.seq_kv * (self.head_dim + self.value_dim)
        return full * self.causal_fraction

    @property
    def keys_read(self) -> int:
        """The keys the kernel reads: a top-left causal mask hides every key past the last query
        from every query, and the kernels stop there (torch's memory-efficient kernel clips each
        query block's keys at its last row, kernel_forward.h CausalFromTopLeft, to within one
        block), so a causal op over more keys than queries (generate's prefill over a preallocated
        static cache, P queries over P + N - 1 keys) is the square one over its first seq_q keys."""
        return min(self.seq_kv, self.seq_q) if self.causal else self.seq_kv

    def unmasked(self) -> "Attention":
        """The same attention without its mask, over the keys it reads (keys_read): what a causal
        mask only takes work away from (kit.predict.small_op_bounds caps the causal one by it)."""
        return replace(self, causal=False, window=0, seq_kv=self.keys_read)

    @property
    def bytes(self) -> float:
        kvh = self.kv_heads or self.heads
        q_o = self.b * self.heads * self.seq_q * (self.head_dim + self.value_dim)
        k_v = self.b * kvh * self.keys_read * (self.head_dim + self.value_dim)
        return float(dtype_bytes(self.dtype) * (q_o + k_v) + self.mask_bytes)


@dataclass(frozen=True)
class Memcpy:
    """A copy of nbytes: device-to-device (read + write on DRAM) or over PCIe (h2d / d2h)."""

    nbytes: int
    direction: str = "d2d"
    op_class = "memcpy"

    def __post_init__(self):
        _positive_ints("memcpy", self, nbytes=self.nbytes)
        if self.direction not in ("d2d", "h2d", "d2h"):
            raise KitError(f"memcpy: direction must be d2d, h2d or d2h, got {self.direction!r}")

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return float(2 * self.nbytes if self.direction == "d2d" else self.nbytes)


Op = Gemm | Elementwise | Softmax | LayerNorm | RMSNorm | Dropout | EmbeddingBag | Attention | Memcpy


def copy_of(nbytes: float, dtype: str = "fp32") -> Elementwise:
    """The elementwise copy that moves nbytes (half read, half written): the proxy of a
    memory-bound kernel."""
    numel = max(1, math.ceil(nbytes / (2 * dtype_bytes(dtype))))
    return Elementwise("copy", numel, dtype)


def elementwise_proxy(op) -> tuple[Elementwise, float] | None:
    """(pass, scale): the learned elementwise pass a memory-bound op without a model of its own is
    costed as, its time scaled by the bytes the op really moves; None for other ops (an embedding
    lookup: the copy of its bytes, below).

    Dropout: CUDA's fused kernel reads x and writes y and a one-byte mask in one pass (the Philox
    draw is ~20 integer ops per element, far below any GPU's ridge point), so it is the one-input
    pass that reads x and writes y, times its bytes over that pass's. A device-to-device memcpy is
    the copy of its bytes. A captured model costs them so (kit.workload.mapping), and `kit op`
    the same way, so both get the per-kernel cost, achieved bandwidth and band the elementwise
    model learned, not the bare wave model (a 1,024-element dropout had come out at 3 ns)."""
    if isinstance(op, Dropout):
        base = Elementwise("mul", op.numel, op.dtype, inputs=1)
        return base, op.bytes / base.bytes
    if isinstance(op, EmbeddingBag):
        # a lookup streams its rows, indices and output: the copy of its bytes, unscaled, so it
        # gets the learned pass's achieved bandwidth, floor and band; the wave model had it at
        # 100% of the bandwidth with a zero-width band, and its floor lift had made a lookup of
        # 128 rows a bag 1.6x faster than one of 100 (kit.embedding.cost is the TBE model, with
        # its index distribution and L2, for embedding tables)
        return copy_of(op.bytes), 1.0
    if isinstance(op, Memcpy) and op.direction == "d2d":
        # the copy of its bytes, unscaled, as kit.workload.kernels.memory_bound costs one: scaled
        # to the exact bytes, the whole fp32 elements' rounding had made a 9-byte copy faster
        # than an 8-byte one and a 1-byte one a quarter of the floor
        return copy_of(op.bytes), 1.0
    return None
