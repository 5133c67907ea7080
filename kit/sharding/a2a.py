"""A vectorised stand-in for kit.comm.predict_alltoallv, fitted to it, for pricing many plans.

A send matrix S (bytes from rank i to j) is summarised by a block of features linear in S, so
the block of a plan is the sum of its tables' blocks:
  * per rank: bytes sent and received within the node and across nodes;
  * on NVLink-mesh and PCIe fabrics, every pair's bytes (pairs have links of different speed);
  * on those fabrics, the bytes leaving and entering each PCIe switch and CPU socket.
The time is a max-plus form over the busiest resources, fitted by non-negative least squares on
probe matrices priced by kit.comm (relative error):

    t(S) = max(floor, a0 + a1·max_r intra_r + a2·max_r inter_r + a3·mean_r sent_r
                         + a4·max_ij S_ij·w_ij + a5·max_switch + a6·max_socket)

with w_ij each pair's marginal ms per byte, probed one pair at a time. Where resources are busy
at once the max form a0 + max_k a_k·term_k fits better; the better of the two is kept.
"""
from __future__ import annotations

import numpy as np


def _ms(result) -> float:
    return float(getattr(result, "time_ms", result))


class Sends:
    """A send matrix held as a few outer products: S[i, j] = sum_k src_k[i] * dst_k[j] for
    i != j, and 0 on the diagonal. Every placement's traffic is one to a node's worth of them (a
    table-wise shard: its rank to every other rank; row-wise: every rank to every other), so its
    features cost O(W) numpy work (A2ASurrogate.block_of) where a W x W matrix built from
    Python (src, dst, bytes) tuples had cost O(W^2) interpreter work: 3,204 placements of 2
    tables on 512 GPUs took ~30 s to build."""

    def __init__(self, world: int):
        self.world = world
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []

    def add(self, src, dst) -> None:
        """Send src[i] * dst[j] bytes from every rank i to every other rank j (scalars: to all)."""
        W = self.world
        self.src.append(np.broadcast_to(np.asarray(src, dtype=float), (W,)))
        self.dst.append(np.broadcast_to(np.asarray(dst, dtype=float), (W,)))

    def matrix(self) -> np.ndarray:
        """The W x W send matrix (bytes from rank i to rank j)."""
        m = np.zeros((self.world, self.world))
        for a, b in zip(self.src, self.dst):
            m += np.outer(a, b)
        np.fill_diagonal(m, 0.0)
        return m


class A2ASurrogate:
    def __init__(self, system, comm):
        from scipy.optimize import nnls

        self.system, self.comm = system, comm
        W = self.W = system.world_size
        node = self.node = np.array([system.node_of(r) for r in range(W)])
        self.inter = node[:, None] != node[None, :]
        kind = getattr(getattr(system, "fabric", None), "kind", "nvswitch")
        self.pairs = kind != "nvswitch" and W <= 16
        self.groups: list[tuple[str, np.ndarray]] = []
        pcie = getattr(system, "pcie", None)
        if self.pairs and pcie is not None:
            local = np.arange(W) % system.gpus_per_node
            sw = node * 1000 + local // pcie.gpus_per_switch
            so = node * 1000 + np.array([pcie.socket_of(int(v)) for v in local])
            for name, ids in (("switch", sw), ("socket", so)):
                if len(np.unique(ids)) > 1:
                    self.groups += [(name, ids == u) for u in np.unique(ids)]
        self.size = 4 * W + (W * W if self.pairs else 0) + 2 * len(self.groups)
        tiny = np.ones((W, W)) - np.eye(W)
        self.floor_ms = _ms(comm.predict_alltoallv(tiny, system))
        self.w = np.zeros((W, W))
        if self.pairs:  # each pair's marginal cost per byte
            for i in range(W):
                for j in range(W):
                    if i != j:
                        m = np.zeros((W, W))
                        m[i, j] = 1e9
                        self.w[i, j] = max(_ms(comm.predict_alltoallv(m, system)) - self.floor_ms, 0) / 1e9
        rng = np.random.default_rng(0)
        mats = []
        for scale in np.geomspace(1e3, 3e8, 12):
            mats.append(np.full((W, W), scale) * (1 - np.eye(W)))
            for density in (0.2, 0.6, 1.0):
                m = rng.random((W, W)) * (rng.random((W, W)) < density) * scale * 2
                np.fill_diagonal(m, 0)
                mats.append(m)
            row = np.zeros((W, W))
            row[rng.integers(W)] = scale * W  # one rank sends to all: table-wise-like
            np.fill_diagonal(row, 0)
            mats.append(row)
        X, y = [], []
        for m in mats:
            ms = _ms(comm.predict_alltoallv(m, system))
            if m.sum() > 0 and ms > 1.2 * self.floor_ms:  # fit the rising part; the floor is a max
                X.append(self.terms(self.block(m)[None])[0])
                y.append(ms)
        X, y = np.array(X), np.array(y)
        self.max_form = False
        if len(y) == 0:  # one rank (nothing to send) or only floor-level sends: the floor alone
            self.coef = np.zeros(self.terms(self.block(np.zeros((W, W)))[None]).shape[1])
            self.max_rel_err = 0.0
            return  # (scipy's nnls on an empty system aborts the process: a double free)
        self.coef, _ = nnls(X / y[:, None], np.ones_like(y))
        err_sum = np.abs(X @ self.coef / y - 1)
        if X.shape[1] > 2:  # resources that are busy at once: try a0 + max_k c_k·term_k too
            from scipy.optimize import least_squares

            start = np.log(np.maximum(np.append(self.coef, 0)[:X.shape[1]], 1e-12) + 1e-12)
            res = least_squares(lambda lc: self._max_form(X, np.exp(lc)) / y - 1, start, method="lm")
            err_max = np.abs(self._max_form(X, np.exp(res.x)) / y - 1)
            if err_max.max() < err_sum.max():
                self.coef, self.max_form, err_sum = np.exp(res.x), True, err_max
        self.max_rel_err = float(err_sum.max()) if len(y) else 0.0

    def block(self, m: np.ndarray) -> np.ndarray:
        """The feature block of one send matrix (linear in m)."""
        m = np.array(m, dtype=float)
        np.fill_diagonal(m, 0.0)
        mi, mx = np.where(self.inter, 0.0, m), np.where(self.inter, m, 0.0)
        parts = [mi.sum(1), mx.sum(1), mi.sum(0), mx.sum(0)]
        if self.pairs:
            parts.append(m.ravel())
        for _, g in self.groups:
            parts.append(np.array([m[g][:, ~g].sum(), m[~g][:, g].sum()]))
        return np.concatenate(parts)

    def block_of(self, sends: Sends) -> np.ndarray:
        """block(sends.matrix()), in O(W) where no pair's bytes are features (W > 16 or an
        NVSwitch fabric): each rank's bytes sent and received within its node and across nodes,
        from the outer products' node sums."""
        if self.pairs or self.groups:  # W <= 16: the matrix is small
            return self.block(sends.matrix())
        W = self.W
        parts = np.zeros((4, W))
        node, n = self.node, self.node.max() + 1
        for a, b in zip(sends.src, sends.dst):
            # sent by rank i: a[i] times b's sum over the others; received by j: b[j] times a's
            for mine, other, at in ((a, b, 0), (b, a, 2)):
                # the sum over each rank's node and over all nodes (the latter as the sum of the
                # node sums, so that it is never below a node's: no inter-node bytes stay 0)
                by_node = np.bincount(node, weights=other, minlength=n)
                own, total = by_node[node], by_node.sum()
                parts[at] += mine * (own - other)  # within the node, less the rank itself
                parts[at + 1] += mine * (total - own)  # across nodes
        return np.concatenate([parts[0], parts[1], parts[2], parts[3]])

    def terms(self, B: np.ndarray) -> np.ndarray:
        """(P, size) blocks -> (P, k) terms of the fitted form (the first is the constant 1)."""
        W = self.W
        s_i, s_x, r_i, r_x = (B[:, k * W:(k + 1) * W] for k in range(4))
        cols = [np.ones(len(B)), np.maximum(s_i, r_i).max(1), np.maximum(s_x, r_x).max(1),
                (s_i.sum(1) + s_x.sum(1)) / W]
        at = 4 * W
        if self.pairs:
            cols.append((B[:, at:at + W * W] * self.w.ravel()).max(1))
            at += W * W
        for name in ("switch", "socket"):
            idx = [k for k, (n, _) in enumerate(self.groups) if n == name]
            if idx:
                g = np.stack([np.maximum(B[:, at + 2 * k], B[:, at + 2 * k + 1]) for k in idx], 1)
                cols.append(g.max(1))
        return np.stack(cols, 1)

    @staticmethod
    def _max_form(X, c):
        return c[0] * X[:, 0] + (X[:, 1:] * c[1:]).max(1)

    def time_ms(self, B: np.ndarray) -> np.ndarray:
        """Predicted all-to-all ms of each block; 0 where nothing is sent."""
        X = self.terms(B)
        t = np.maximum(self.floor_ms, self._max_form(X, self.coef) if self.max_form else X @ self.coef)
        return np.where(B[:, :4 * self.W].sum(1) > 0, t, 0.0)
