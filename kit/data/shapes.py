"""Shapes for the collector: named grids and NeuSight's dims files.

A shape is a tuple in NeuSight's order, told apart by its length:

    (B, M, N, K)          GEMM: bmm (B×M×N)·(B×N×K); linear nn.Linear(N, K) on a (B, M, N) input
    (B, H)                vector ops on a (B, H) tensor (elementwise, softmax, layer norm)
    (B, Cin, Cout, ks, S, stride, pad)   conv2d, square kernel ks and square input S

Named grids (`NAME[:COUNT[:SEED]]` for the random ones; every draw is seeded):

    random-bmm      B, M, N, K each log-uniform in [1, 1024], like NeuSight's train_bmm dims
    random-linear   B=1, M log-uniform in [1, 8192], N and K in [1, 65536], at most 1 GiB fp32
    random-vec      B log-uniform in [1, 16384], H in [1, 4096], like NeuSight's train_vec dims
    aligned-linear  B=1, M log-uniform in [1, 16384], N and K multiples of 64 in [64, 16384]
                    (log-uniform): the aligned GEMMs of real models, which random-linear's
                    uniform dims rarely draw (1 in 64 has N and K both multiples of 8)
    aligned-bmm     B log-uniform in [1, 512], M, N, K multiples of 16 in [16, 4096]
    tiny-gemm, tiny-vec   dims in [1, 32] (smoke tests: fast anywhere)
    <model>-layers  the GEMM and vector shapes of one transformer layer of a real model at
                    batch 1, 2, 4, 8 and the model's context length: gpt2, gpt2-large,
                    bert-large, gpt3-xl, opt-1.3b (e.g. "gpt2-layers")
    decode-linear   the weight GEMMs of a decode step (kit.workload.kv_cache): every weight of
                    GPT-2, OPT-1.3B, Llama-3 8B and 70B at m = 1..64 new tokens (NeuSight's
                    data has ~35 GEMMs a GPU with m <= 16, and none in half precision)
    decode-bmm      attention's q·Kᵀ and p·V of one query over 512..16384 cached tokens
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kit.data.neusight import MAX_ELEMENTS
from kit.errors import KitError, refuse_device

KIND_OF_LENGTH = {4: "gemm", 2: "vec", 7: "conv"}

# Transformer configs (hidden, heads, ffn, vocab, context), from the models' published configs:
# GPT-2 and GPT-2 large: HF "gpt2", "gpt2-large" config.json; BERT-large: Devlin et al. 2019
# (and HF "bert-large-uncased"); GPT-3 XL: Brown et al. 2020, Table 2.1 (d_model 2048, 24 heads);
# OPT-1.3B: Zhang et al. 2022, Table 1 (and HF "facebook/opt-1.3b").
MODELS = {
    "gpt2": (768, 12, 3072, 50257, 1024),
    "gpt2-large": (1280, 20, 5120, 50257, 1024),
    "bert-large": (1024, 16, 4096, 30522, 512),
    "gpt3-xl": (2048, 24, 8192, 50257, 2048),
    "opt-1.3b": (2048, 32, 8192, 50272, 2048),
}
MODEL_BATCHES = (1, 2, 4, 8)
RANDOM_GRIDS = ("random-bmm", "random-linear", "random-vec", "aligned-linear", "aligned-bmm",
                "tiny-gemm", "tiny-vec")
# (in, out) of the weights a decode step reads: GPT-2 (768, 3072, vocab 50257), OPT-1.3B (2048,
# 8192), Llama-3 8B (4096, 8 KV heads of 128, 14336, vocab 128256) and 70B (8192, 28672): their
# HF config.json files (kit.workload.zoo)
DECODE_WEIGHTS = ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257),
                  (2048, 2048), (2048, 8192), (8192, 2048), (2048, 50272),
                  (4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256),
                  (8192, 8192), (8192, 1024), (8192, 28672), (28672, 8192), (8192, 128256))
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
DECODE_ATTENTION = ((32, 128), (256, 128), (512, 64))  # (batch x heads, head_dim)
DECODE_CONTEXTS = (512, 2048, 8192, 16384)
DECODE_GRIDS = ("decode-linear", "decode-bmm")
DEFAULT_COUNT = 1000


def grid_names() -> list[str]:
    return [*RANDOM_GRIDS, *(f"{m}-layers" for m in MODELS), *DECODE_GRIDS]


def decode_shapes(name: str) -> list[tuple[int, ...]]:
    """The decode grids (see the module doc), NeuSight order: decode-linear (1, m, in, out);
    decode-bmm (b·h, 1, d, T) for q·Kᵀ and (b·h, 1, T, d) for p·V."""
    if name == "decode-linear":
        return [(1, m, n_in, n_out) for n_in, n_out in DECODE_WEIGHTS for m in DECODE_TOKENS]
    return [s for bh, d in DECODE_ATTENTION for t in DECODE_CONTEXTS for s in ((bh, 1, d, t), (bh, 1, t, d))]


def shape_kind(shape: tuple) -> str:
    try:
        return KIND_OF_LENGTH[len(shape)]
    except KeyError:
        raise KitError(f"shape {shape} has {len(shape)} dims: expected B;M;N;K (GEMM), B;H "
                       "(vector) or B;Cin;Cout;ks;S;stride;pad (conv)") from None


def _most_elements(dims: tuple) -> int:
    """The largest operand (or output) of a dims-file shape, in elements: any two of a GEMM's
    M, N, K with its batch, a vector's B x H (a convolution's are left to its reader)."""
    if len(dims) == 4:
        b, m, n, k = dims
        return b * max(m * n, n * k, m * k)
    return dims[0] * dims[1] if len(dims) == 2 else 0


def read_dims_file(path: str | Path) -> list[tuple[int, ...]]:
    """NeuSight's dims format: one shape a line, dims separated by ';' (',' also accepted).

    Blank lines and lines starting with '#' are skipped; repeated shapes are kept once.
    """
    path = Path(path)
    refuse_device(path, "shapes file")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KitError(f"shapes file not found: {path} (or use a named grid: "
                       f"{', '.join(grid_names())})") from None
    except IsADirectoryError:
        raise KitError(f"shapes file {path} is a folder; give a dims file or a named grid") from None
    except UnicodeDecodeError:
        raise KitError(f"cannot read shapes file {path}: binary data, not text") from None
    except OSError as e:
        raise KitError(f"cannot read shapes file {path}: {e}") from None
    shapes: dict[tuple, None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.replace(",", ";").split(";")]
        try:
            dims = tuple(int(p) for p in parts)
        except ValueError:
            raise KitError(f"{path}:{number}: {line!r} is not whole numbers separated by ';'") from None
        if len(dims) not in KIND_OF_LENGTH:
            raise KitError(f"{path}:{number}: {line!r} has {len(dims)} dims; expected B;M;N;K, B;H "
                           "or B;Cin;Cout;ks;S;stride;pad")
        # all positive but a conv's padding (its last), as the readers have them: a stride of 0
        # had been planned, and every measurement of it failed in torch
        if any(d < 1 for d in (dims[:6] if len(dims) == 7 else dims)) or dims[-1] < 0:
            raise KitError(f"{path}:{number}: {line!r}: dims must be positive (a conv's padding may be 0)")
        most = _most_elements(dims)
        if most > MAX_ELEMENTS:
            # the readers refuse such a row (kit.data.schema, kit.data.neusight): timed, it had
            # made the whole CSV unloadable, --resume included
            raise KitError(f"{path}:{number}: {line!r}: an operand of {most:.3g} elements is past "
                           "the 2^40 any GPU holds; check the shape")
        shapes[dims] = None
    if not shapes:
        raise KitError(f"shapes file {path} has no shapes")
    return list(shapes)


def _log_uniform(rng: np.random.Generator, high: int, size) -> np.ndarray:
    return np.maximum(1, np.round(np.exp(rng.uniform(0.0, math.log(high), size)))).astype(int)


def random_grid(name: str, count: int = DEFAULT_COUNT, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    out: dict[tuple, None] = {}
    tries = 0
    while len(out) < count and tries < 50 * count:
        tries += 1
        if name == "random-bmm":
            shape = tuple(int(x) for x in _log_uniform(rng, 1024, 4))
        elif name == "random-linear":
            m, n, k = _log_uniform(rng, 8192, 1)[0], *_log_uniform(rng, 65536, 2)
            if 4 * (m * n + n * k + m * k) > 2**30:  # keep one call's tensors under 1 GiB fp32
                continue
            shape = (1, int(m), int(n), int(k))
        elif name == "aligned-linear":
            m, n, k = _log_uniform(rng, 16384, 1)[0], *(64 * _log_uniform(rng, 256, 2))
            if 4 * (m * n + n * k + m * k) > 2**30:
                continue
            shape = (1, int(m), int(n), int(k))
        elif name == "aligned-bmm":
            b, (m, n, k) = _log_uniform(rng, 512, 1)[0], 16 * _log_uniform(rng, 256, 3)
            if 4 * b * (m * n + n * k + m * k) > 2**30:
                continue
            shape = (int(b), int(m), int(n), int(k))
        elif name == "random-vec":
            shape = (int(_log_uniform(rng, 16384, 1)[0]), int(_log_uniform(rng, 4096, 1)[0]))
        elif name == "tiny-gemm":
            shape = tuple(int(x) for x in rng.integers(1, 33, 4))
        elif name == "tiny-vec":
            shape = tuple(int(x) for x in rng.integers(1, 33, 2))
        else:
            raise AssertionError(name)
        out[shape] = None
    return list(out)


def model_layer_shapes(model: str, batches=MODEL_BATCHES) -> list[tuple[int, ...]]:
    """GEMM and vector shapes of one transformer layer (+ the LM head), NeuSight order."""
    hidden, heads, ffn, vocab, seq = MODELS[model]
    head_dim = hidden // heads
    out: dict[tuple, None] = {}
    for bs in batches:
        tokens = bs * seq
        for n_in, n_out in ((hidden, 3 * hidden), (hidden, hidden), (hidden, ffn), (ffn, hidden),
                            (hidden, vocab)):
            out[(1, tokens, n_in, n_out)] = None  # linear: (1, tokens, in) @ (in, out)
        out[(bs * heads, seq, head_dim, seq)] = None  # scores = Q·Kᵀ
        out[(bs * heads, seq, seq, head_dim)] = None  # context = P·V
        out[(bs * heads * seq, seq)] = None  # softmax over the keys
        out[(tokens, hidden)] = None  # layer norm, residual add
        out[(tokens, ffn)] = None  # gelu
    return list(out)


def resolve_shapes(spec: str) -> list[tuple[int, ...]]:
    """A named grid (see the module doc) or a path to a dims file."""
    if not spec.strip():
        raise KitError(f"--shapes is empty: give a dims file or a grid: {', '.join(grid_names())}")
    name, *rest = spec.split(":")
    if name in RANDOM_GRIDS:
        try:
            count = int(rest[0]) if rest else DEFAULT_COUNT
            seed = int(rest[1]) if len(rest) > 1 else 0
        except ValueError:
            raise KitError(f"grid {spec!r}: write {name}[:COUNT[:SEED]] with whole numbers") from None
        if count < 1 or seed < 0 or len(rest) > 2:
            raise KitError(f"grid {spec!r}: write {name}[:COUNT[:SEED]] with COUNT >= 1 and SEED >= 0")
        shapes = random_grid(name, count, seed)
        if len(shapes) < count:  # tiny-vec has 32 x 32 = 1,024 shapes: tiny-vec:2000 gave 1,024 unsaid
            raise KitError(f"grid {spec!r}: {name} gave {len(shapes)} distinct shapes, fewer than the "
                           f"{count} asked; ask for at most {len(shapes)}")
        return shapes
    if name in DECODE_GRIDS and not rest:
        return decode_shapes(name)
    if name.endswith("-layers") and name[:-len("-layers")] in MODELS and not rest:
        return model_layer_shapes(name[:-len("-layers")])
    if Path(spec).exists() or any(c in spec for c in "/\\.") :
        return read_dims_file(spec)
    raise KitError(f"unknown shapes {spec!r}: give a dims file (B;M;N;K or B;H a line) or a grid: "
                   f"{', '.join(grid_names())}")
