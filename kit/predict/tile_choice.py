"""Which tile would the library pick? Learned from the kernel names in the training data.

On a GPU nobody has measured, no kernel name says which sgemm tile cuBLAS chose. The library's
heuristic depends on the shape and on the GPU, so a small classifier learns it from measured
rows (shape + GPU features -> the tile named in the kernel, e.g. ampere_sgemm_128x64_tn) and
predicts it for any shape on any GPU in the catalog. The tile it reports is the library's
name (cuBLAS tile m × n, column-major); kit.tiling gets it as the kit's (tn, tm).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit.errors import KitError
from kit.hardware import GPU, get_gpu
from kit.ops import Gemm
from kit.predict.features import arrays_from_frame, arrays_from_ops, gpu_vector, lib_tile

FEATURES = ["log_m", "log_n", "log_k", "log_b", "linear"]
# An unbatched GEMM whose whole output fits a 64x64 block and whose reduction is long runs on
# cuBLAS's 32x32 "sliced" SIMT kernel on Volta and later (volta_/ampere_sgemm_32x32_sliced1x4,
# split along k): NeuSight's such Linear rows (k >= 1,024) ran it 20 of 21 times on the
# A100-40GB, 15 of 21 on the V100, 8 of 16 on the T4 (64x32 the rest), where Pascal ran 128x32
# every time. The classifier met few such rows and chose 128x128 for them (NeuSight's own
# 14x55x17348 on the A100-40GB: 0.20 ms predicted, 0.06 ms measured), so they take the 32x32 tile.
SLICED_ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
SLICED_MAX_OUTPUT = 64 * 64  # elements of the output
SLICED_MIN_K = 1024
SLICED_TILE = (32, 32)


def shape_matrix(a: dict, gpu: GPU | str) -> np.ndarray:
    """Shape features of a GEMM batch (kit.predict.features arrays) and the GPU's features."""
    shape = np.column_stack([np.log(a["m"]), np.log(a["n"]), np.log(a["k"]), np.log(a["b"]),
                             a["linear"]])
    return np.column_stack([shape, np.tile(gpu_vector(gpu, gemm=True), (len(shape), 1))])


class TileChooser:
    """A softmax classifier over the tiles seen in training; `vocab` rows are
    (library tile_m, tile_n, tile_k, threads)."""

    def __init__(self, vocab: list[tuple[int, int, int, int]], model=None):
        self.vocab = [tuple(int(v) for v in t) for t in vocab]
        self.model = model

    @staticmethod
    def fit(frame: pd.DataFrame, seed: int = 0, epochs: int = 12, hidden: int = 64,
            min_steps: int = 300, progress=None) -> "TileChooser":
        """Learn from the FP32 GEMM rows of a measurement table that name a tile."""
        import torch

        from kit.predict.nets import MLP, fit

        # FP32 rows alone, as the tile-MLP's (kit.predict.tile_fit.training_design): the
        # classifier has no dtype input, and a collected bf16 row's tensor-core tile (an nvjet
        # 128x256 of k 64) had joined the vocabulary and been the answer for FP32 GEMMs of its shape
        fp32 = (frame["dtype"].fillna("fp32") == "fp32") if "dtype" in frame.columns else True
        rows = frame[(frame.op_class == "gemm") & frame.tile_m.notna() & frame.tile_n.notna() & fp32]
        if rows.empty:
            raise KitError("tile choice: no FP32 GEMM rows with a tile in the kernel name to learn from")
        threads = (rows.block_x.fillna(1) * rows.block_y.fillna(1) * rows.block_z.fillna(1)
                   ).astype(int)
        tk = rows.tile_k.fillna(8).astype(int)
        key = list(zip(rows.tile_m.astype(int), rows.tile_n.astype(int)))
        table = pd.DataFrame({"key": key, "tk": tk.values, "threads": threads.values})
        vocab = []
        for k, grp in table.groupby("key", sort=True):
            vocab.append((k[0], k[1], int(grp.tk.mode().iloc[0]), int(grp.threads.mode().iloc[0])))
        index = {(v[0], v[1]): i for i, v in enumerate(vocab)}
        xs, ys, ws = [], [], []
        for gpu, grp in rows.groupby("gpu", sort=True):
            xs.append(shape_matrix(arrays_from_frame("gemm", grp), gpu))
            ys += [index[(int(a), int(b))] for a, b in zip(grp.tile_m, grp.tile_n)]
            ws.append(np.full(len(grp), 1.0 / len(grp)))  # every GPU counts the same
        x, y, weight = np.concatenate(xs), torch.tensor(ys), np.concatenate(ws)
        torch.manual_seed(seed)
        model = MLP(x.shape[1], len(vocab), hidden=hidden, depth=2)
        model.set_scale(x)
        ce = torch.nn.CrossEntropyLoss(reduction="none")
        fit(model, x, lambda out, idx: ce(out, y[idx]), epochs=epochs, seed=seed,
            sample_weight=weight, min_steps=min_steps, progress=progress)
        return TileChooser(vocab, model)

    def choose_index(self, a: dict, gpu: GPU | str, dtype: str = "fp32") -> np.ndarray:
        """Index into vocab of the tile chosen for each GEMM of the batch `a` (of one dtype;
        a["split_ways"], where given: each GEMM is the split-K batch of that many ways)."""
        return self.probabilities(a, gpu, dtype).argmax(1)

    def probabilities(self, a: dict, gpu: GPU | str, dtype: str = "fp32") -> np.ndarray:
        """(n, len(vocab)): the classifier's probability of each tile, per GEMM of the batch `a`;
        one-hot where the sliced rule sets the tile (_sliced)."""
        from kit.predict.array_mlp import ArrayMLP

        if len(a["m"]) == 0:
            return np.zeros((0, len(self.vocab)))
        gpu = get_gpu(gpu)
        x = shape_matrix(a, gpu)
        if isinstance(self.model, ArrayMLP):  # loaded weights: no torch
            logits = np.asarray(self.model(x), dtype=float)
        else:
            from kit.predict.nets import predict

            logits = np.asarray(predict(self.model, x), dtype=float)
        prob = np.exp(logits - logits.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        ruled = self._sliced(a, gpu, dtype, np.full(len(prob), -1))
        at = np.flatnonzero(ruled >= 0)
        prob[at] = 0.0
        prob[at, ruled[at]] = 1.0
        return prob

    def _sliced(self, a: dict, gpu: GPU, dtype: str, chosen: np.ndarray) -> np.ndarray:
        """chosen, with the 32x32 tile for the small-output, long-k FP32 GEMMs cuBLAS runs on
        its sliced SGEMM kernel (SLICED_ARCHS; a vocabulary without that tile changes nothing)."""
        small = [i for i, v in enumerate(self.vocab) if (v[0], v[1]) == SLICED_TILE]
        if not small or dtype != "fp32" or gpu.vendor != "nvidia" or gpu.arch not in SLICED_ARCHS:
            return chosen
        # an unbatched GEMM, or the split-K batch of one (kit.predict.split_k: b = S ways, each
        # reducing k, the whole reduction S x k), which runs the same kernel; batched GEMMs
        # (NeuSight's small bmm rows ran other tiles) and a grouped conv's groups keep the choice
        ways = np.asarray(a.get("split_ways", np.ones(len(chosen))), dtype=float)
        unbatched = np.asarray(a["b"]) == ways
        take = (unbatched & (np.asarray(a["m"]) * np.asarray(a["n"]) <= SLICED_MAX_OUTPUT)
                & (np.asarray(a["k"]) * ways >= SLICED_MIN_K))
        return np.where(take, small[0], chosen)

    def tile_arrays(self, a: dict, gpu: GPU | str, dtype: str = "fp32",
                    chosen: np.ndarray | None = None) -> tuple[dict, list[str]]:
        """(kit-orientation tile arrays for waves(), library tile names "MxN") per GEMM; chosen:
        the vocab indices, where already chosen (choose_index, or probabilities' argmax)."""
        if chosen is None:
            chosen = self.choose_index(a, gpu, dtype)
        v = np.array(self.vocab, dtype=float).reshape(-1, 4)[np.asarray(chosen, dtype=int)]
        names = [f"{int(m)}x{int(n)}" for m, n in v[:, :2]]
        return lib_tile(v[:, 0], v[:, 1], v[:, 3], v[:, 2]), names

    def choose(self, gemms: list, gpu: GPU | str) -> list[tuple[int, int, int, int]]:
        """The library tile (tile_m, tile_n, tile_k, threads) for each kit Gemm, chosen for its
        dtype."""
        if not all(isinstance(g, Gemm) for g in gemms):
            raise KitError("tile choice applies to GEMMs only")
        out: list = [None] * len(gemms)
        # one batch per dtype, as the predictor chooses (kit.predict.tile_mlp): the sliced rule
        # is FP32's alone; one fp32 batch had given an RTX 3090's fp16 GEMMs of a small output
        # and a long k the 32x32 sliced tile for 33 of 102 shapes where the predictor prices another
        for dtype in sorted({g.dtype for g in gemms}):
            idx = [i for i, g in enumerate(gemms) if g.dtype == dtype]
            chosen = self.choose_index(arrays_from_ops("gemm", [gemms[i] for i in idx]), gpu, dtype)
            for i, c in zip(idx, chosen):
                out[i] = self.vocab[c]
        return out

    def accuracy(self, frame: pd.DataFrame) -> float:
        """Share of a table's GEMM rows (with a named tile) whose tile the chooser gets right."""
        rows = frame[(frame.op_class == "gemm") & frame.tile_m.notna() & frame.tile_n.notna()]
        hits = 0
        vocab = np.array(self.vocab).reshape(-1, 4)
        dtype = (rows["dtype"].fillna("fp32") if "dtype" in rows.columns
                 else pd.Series("fp32", index=rows.index))
        for (gpu, dt), grp in rows.groupby([rows.gpu, dtype]):
            got = vocab[self.choose_index(arrays_from_frame("gemm", grp), gpu, dt)]
            hits += int(((got[:, 0] == grp.tile_m.to_numpy(int))
                         & (got[:, 1] == grp.tile_n.to_numpy(int))).sum())
        return hits / max(len(rows), 1)

    # -- weights ---------------------------------------------------------------------------
    def state(self) -> tuple[dict, dict]:
        from kit.predict.array_mlp import ArrayMLP

        m = self.model
        n_in, hidden = ((m.n_in, m.hidden) if isinstance(m, ArrayMLP)
                        else (int(m.x_mean.numel()), int(m.net[0].out_features)))
        return ({f"tile_choice.{k}": v for k, v in m.state_dict().items()},
                {"vocab": [list(v) for v in self.vocab], "n_in": n_in, "hidden": hidden})

    @staticmethod
    def from_state(tensors: dict, meta: dict) -> "TileChooser":
        from kit.predict.array_mlp import ArrayMLP

        vocab = meta["vocab"]
        if not isinstance(vocab, list) or not vocab or not all(
                isinstance(v, list) and len(v) == 4
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v) for v in vocab):
            # a tile of 0 rows had divided by 0 in the occupancy
            raise ValueError(f"tile_choice.vocab must be a non-empty list of tiles, each 4 whole "
                             f"numbers >= 1 (rows, columns, k step, threads), got {vocab!r:.80}")
        model = ArrayMLP({k.split(".", 1)[1]: v for k, v in tensors.items()
                          if k.startswith("tile_choice.")},
                         meta["n_in"], len(meta["vocab"]), hidden=meta["hidden"], depth=2)
        return TileChooser([tuple(v) for v in meta["vocab"]], model)
