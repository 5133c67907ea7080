"""Collective algorithms on a topology, each reduced to  time = latency + size x cost-per-byte.

For a group of N ranks on k nodes (at most g per node), with
  B_ring  intra-node ring rate per GPU,   B_net  node network egress,   M  GPU memory bandwidth,
  s_in / s_net  per-step latency of one NVLink/PCIe hop / one network hop,  kappa  HBM bytes per byte:

  all-reduce  ring         2(N-1) steps, wire 2(N-1)/N per byte on the slower of B_ring, B_net
              nvls         NVLink SHARP: 2 steps, each byte out once and in once at the NVLS rate
              tree         NCCL double binary tree across nodes, chain inside: 2(g-1)+2log2(k)
                           steps, 2 bytes per byte on the node links (NCCL's tuning model)
              hier-ring    intra reduce-scatter + inter ring all-reduce + intra all-gather, run one
                           after the other (the framework-level composition)
              collnet-sharp   intra ring reduce-scatter/all-gather, in-network (SHARP) reduction:
                           1 byte per byte on the node links, pipelined with the intra part
              nvls-sharp   NVLS inside, SHARP across nodes, pipelined
              (SHARP only on a network with it on, e.g. ib-ndr-sharp: NCCL's CollNet is opt-in)
  reduce-scatter / all-gather   ring (N-1 steps, wire (N-1)/N), nvls in one NVSwitch node,
                               hier-ring across nodes (rail-wise across, then ring inside)
  broadcast / reduce           pipelined ring chain (N-1 steps, wire 1)
  Which steps pay s_net (ring_steps): each step's latency is charged at the link it crosses (the
  idea of NCCL's tuning model), following the slowest chunk. A ring over k > 1 nodes (ranks
  grouped by node) has exactly k node-crossing links; a reduce-scatter or all-gather chunk
  travels N-1 of the N links, so the slowest crosses min(k, N-1) of them: N-1 steps, min(k, N-1)
  at s_net, the rest at s_in; an all-reduce is both, 2(N-1) steps, 2 min(k, N-1) at s_net. A
  chain (broadcast/reduce) visits each node once: N-1 steps, k-1 at s_net. One node: all at s_in.
  all-to-all / send-recv       direct transfers; see alltoallv_us
B_net is the node's NICs that the group's GPUs there use (rail-aligned, group_nics). Groups that
run at once share them (plans' senders): NCCL leaves each node of a ring (or tree) through a
NIC per channel, and its tuning model gives a communicator the bandwidth of those NICs as if it
ran alone (tuning.cc: bwInter per channel), but a NIC's line rate caps the sum of the flows of
every communicator through it. The tp DP groups of a Megatron stage, one GPU of each a node at
tp = GPUs a node, all-reduce their gradient buckets at the same time: on a node of 2 NICs for 8
GPUs (pcie8) each ring gets 2/8 of a NIC, not the whole NIC of a lone group (4x the wire time).
An all-to-all's groups share them alike (uniform_alltoall_us): the EP groups of a MoE stage, one
a tp rank and a run of ep DP ranks, dispatch and combine at once, and all of a node's GPUs of
them send off the node together.
Every algorithm also pays kappa/M per byte (kappa/2 for collectives without a full reduction),
the local HBM traffic that does not overlap the wire. Sources: NCCL's algorithms and its tuning
model (src/graph/tuning.cc); Thakur et al., "Optimization of collective communication operations
in MPICH" (IJHPCA 2005) for ring/tree step and byte counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from kit.comm.topology import (Group, gpu_nics, group_ring_gbs, node_net_gbs, node_nics,
                               nic_shares, nvls_gbs, p2p_gbs, shared_nics)
from kit.hardware.system import System

if TYPE_CHECKING:  # numpy is imported where it is used: no preset's collective but an all-to-all needs it
    import numpy as np

_NS = 1e3  # GB/s -> bytes per microsecond


@dataclass(frozen=True)
class Plan:
    algorithm: str
    latency_us: float
    us_per_byte: float


def _mem(system: System) -> float:
    return system.gpu.mem_bw_gbs * _NS


def ring_steps(kind: str, group: Group) -> tuple[int, int]:
    """(steps at the intra-node latency, steps at the network latency) of a ring or chain
    algorithm on this group; see the module doc. Their sum is 2(N-1) for all-reduce, else N-1."""
    n, k = group.size, group.n_nodes
    if kind in ("broadcast", "reduce"):
        return n - k, k - 1
    passes = 2 if kind == "allreduce" else 1
    inter = 0 if k == 1 else min(k, n - 1)
    return passes * (n - 1 - inter), passes * inter


# a one-rank collective is a device copy (out of place, as nccl-tests runs it): 2 bytes of HBM
# traffic a payload byte. It had taken half the fitted reduction traffic (1.38), so a 1 GB one-rank
# all-reduce on an H100 (0.45 ms) beat the 0.60 ms its copy needs at the full bandwidth.
LOCAL_COPY_BYTES_PER_BYTE = 2.0


def _kappa(system: System, full_reduce: bool) -> float:
    k = system.soft("hbm_bytes_per_byte")
    return (k if full_reduce else k / 2) / _mem(system)


# The ranks the NVLS rate (a fabric's nvls_efficiency) was read at: 8-GPU DGX H100 nccl-tests
NVLS_CALIBRATED_RANKS = 8


def nvls_wire(n: int) -> float:
    """Bytes each GPU's NVLink carries per byte of an NVLS all-reduce over n GPUs, relative to
    the NVLS_CALIBRATED_RANKS it was read at: each direction carries the buffer once and its own
    1/n shard once (the switch reads every GPU's buffer and returns the reduced shard, then
    multicasts each shard to all), so (1 + 1/n) / (1 + 1/8); an NVLS all-reduce on 4 GPUs had cost
    what it does on 8 a byte, though each link carries 11% more of it."""
    return (1.0 + 1.0 / n) / (1.0 + 1.0 / NVLS_CALIBRATED_RANKS)


def plans(system: System, kind: str, group: Group, senders: int = 1) -> tuple[Plan, ...]:
    """Every algorithm that can run `kind` on this group, as (latency, cost per byte). senders:
    the groups of a node that cross nodes at the same time, this one included, which share that
    node's NICs: for sendrecv the sends leaving or entering a node (nic_share); for the ring,
    tree, chain and all-to-all collectives the concurrent groups, each placed as this one
    (node_net_gbs, uniform_alltoall_us), e.g. the tp DP groups of a stage, one GPU of each a
    node, all-reducing gradients at once, or its EP groups' MoE all-to-alls. An int for every
    node, or a tuple of one a node of the group (group.nodes' order): a count, or the local GPUs
    of each concurrent group there (topology.shared_nics)."""
    return _plans(system, kind, group, system.gpu, senders)


@lru_cache(maxsize=8192)
def _plans(system: System, kind: str, group: Group, gpu, senders=1) -> tuple[Plan, ...]:
    """plans, cached also on the GPU spec (its HBM terms): a System names its GPU
    by key, and register_gpu may replace the spec behind that key (a stale cache had kept the
    old one's times in the same process)."""
    n, k, g = group.size, group.n_nodes, group.max_per_node
    base = system.soft("base_latency_us")
    if n == 1:  # NCCL copies the buffer out of place: each byte read once and written once
        return (Plan("local", base, LOCAL_COPY_BYTES_PER_BYTE / _mem(system)),)
    s_in, s_net = system.fabric.step_latency_us, system.network.step_latency_us
    b_ring = group_ring_gbs(system, group) * _NS
    b_net = node_net_gbs(system, group, senders) * _NS if k > 1 else math.inf
    nvls = nvls_gbs(system) * _NS if system.fabric.kind == "nvswitch" else 0.0
    slow = 1.0 / min(b_ring, b_net)
    intra, inter = ring_steps(kind, group)
    ring_lat = base + intra * s_in + inter * s_net
    out: list[Plan] = []
    if kind == "allreduce":
        w = 2.0 * (n - 1) / n
        kap = _kappa(system, True)
        out.append(Plan("ring", ring_lat, w * slow + kap))
        if k == 1 and nvls and n > 2:
            out.append(Plan("nvls", base + 2 * s_in, nvls_wire(n) / nvls + kap / 2))
        if k > 1:
            depth = math.ceil(math.log2(k))
            out.append(Plan("tree", base + 2 * (g - 1) * s_in + 2 * depth * s_net,
                            2.0 * max(1.0 / b_ring, 1.0 / b_net) + kap))
            w_in = 2.0 * (g - 1) / g
            if g > 1:  # one GPU a node: the flat ring itself (a rounding tie had named it hier-ring)
                out.append(Plan("hier-ring", base + 2 * (g - 1) * s_in + 2 * (k - 1) * s_net,
                                w_in / b_ring + 2.0 * (k - 1) / k / b_net + kap))
            if system.network.sharp:
                out.append(Plan("collnet-sharp", base + 2 * (g - 1) * s_in + 2 * s_net,
                                max(w_in / b_ring, 1.0 / b_net) + kap))
                if nvls and g > 2:  # NVLS inside a node needs more than two of its GPUs
                    out.append(Plan("nvls-sharp", base + 2 * s_in + 2 * s_net,
                                    max(nvls_wire(g) / nvls, 1.0 / b_net) + kap / 2))
    elif kind in ("reducescatter", "allgather"):
        w = (n - 1) / n
        kap = _kappa(system, False)
        out.append(Plan("ring", ring_lat, w * slow + kap))
        if k == 1 and nvls and n > 2:
            out.append(Plan("nvls", base + s_in, w / b_ring + kap))
        if k > 1 and g > 1:  # reduce-scatter inside each node first, then across the nodes on the 1/g
            # each rank holds (all-gather: the reverse), one phase after the other
            out.append(Plan("hier-ring", base + (g - 1) * s_in + (k - 1) * s_net,
                            (g - 1) / g / b_ring + (k - 1) / k / b_net + kap))
    elif kind in ("broadcast", "reduce"):
        out.append(Plan("ring", ring_lat, slow + _kappa(system, False)))
    elif kind == "alltoall":
        out.append(Plan("p2p", alltoall_latency_us(system, group),
                        uniform_alltoall_us(system, group, senders) + _kappa(system, False) * (n - 1) / n))
    elif kind == "sendrecv":
        # nccl-tests sendrecv: rank i sends `size` to rank i+1 (a ring shift)
        worst = max(_pair_us_per_byte(system, a, b, senders)
                    for a, b in zip(group.ranks, group.ranks[1:] + group.ranks[:1]))
        lat = base + (s_net if k > 1 else s_in)
        out.append(Plan("p2p", lat, worst + _kappa(system, False)))
    else:  # pragma: no cover - kinds are validated by the caller
        raise ValueError(kind)
    return tuple(out)


def _pair_us_per_byte(system: System, a: int, b: int, senders: int = 1) -> float:
    g = system.gpus_per_node
    if a // g == b // g:
        return 1.0 / (p2p_gbs(system, a % g, b % g) * _NS)
    net = system.network
    return 1.0 / (nic_share(system, senders) * net.nic_bw_gbs * net.efficiency * _NS)


def nic_share(system: System, senders: int) -> float:
    """NICs each of `senders` concurrent cross-node sends of one node gets: the NICs the node
    uses for that many of its GPUs (node_nics) divided among them, and never more than a GPU's
    own share, max(1, nics_per_gpu) (as _network_us divides them for an all-to-all). A pipeline
    stage's tp x dp ranks all send to the next stage at once: at tp 8 on two pcie8 nodes (2 NICs
    for 8 GPUs) each of the 8 sends had been priced on a whole NIC, 4x its 1/4 share."""
    return min(max(1.0, system.nics_per_gpu), node_nics(system, senders) / senders)


def alltoall_latency_us(system: System, group: Group) -> float:
    s = system.soft
    lat = s("base_latency_us") + system.fabric.step_latency_us + s("peer_overhead_us") * (group.size - 1)
    return lat + (system.network.step_latency_us if group.n_nodes > 1 else 0.0)


def uniform_alltoall_us(system: System, group: Group, sharing=1) -> float:
    """alltoallv_us of the even all-to-all (1/n of each byte from every rank to every other),
    node by node: the n x n matrix of a million-rank group had taken 8 TiB (a MemoryError
    traceback for `kit comm predict alltoall --nodes 131072`, 39 s at 2,048 nodes).
    sharing: the groups crossing nodes at once on each node, this one included (an int for
    every node, or one a node in group.nodes' order: a count, or their local GPUs), which split
    the NICs of their GPUs there (shared_nics): a node's c GPUs of the group send c (n - c) / n of a byte off it, and
    so do the others'. The EP groups of tp 8 x dp 2 x ep 2 on two pcie8 nodes (2 NICs for 8
    GPUs), one GPU of each a node, had each been priced on a whole NIC: 4x their 2/8 share."""
    import numpy as np

    n = group.size
    times = [0.0]
    for loc in {loc for _, loc in group.nodes}:  # the traffic inside one node: its c x c block
        if len(loc) > 1:
            block = np.full((len(loc), len(loc)), 1.0 / n)
            times.append(alltoallv_us(system, Group(ranks=loc, nodes=((0, loc),)), block))
    if group.n_nodes > 1:  # alltoallv_us's network terms, in closed form
        fewest = min(len(loc) for _, loc in group.nodes)  # its ranks send the most off the node
        counts = sharing if isinstance(sharing, tuple) else (sharing,) * group.n_nodes
        per_node = set()
        for s, (_, loc) in zip(counts, group.nodes):
            off = (n - len(loc)) / n  # each of its GPUs sends this much of a byte off the node
            if isinstance(s, int) and s > 1:  # s groups placed alike: shared_nics' even split
                per_node.add((len(loc) * off, shared_nics(system, loc, s)))
            else:  # each NIC its GPUs' bytes, at its share among the groups on it
                share = nic_shares(system, loc, s)
                per_node |= {(b * off, share[j]) for j, b in _nic_bytes(system, loc, [1.0] * len(loc)).items()}
        times += _network_us(system, (n - fewest) / n, sorted(per_node))
    return float(max(times))


def _nic_bytes(system: System, local, per_gpu) -> dict:
    """NIC -> the bytes the node's GPUs `local` send through it, per_gpu[i] from local[i], a GPU's
    spread evenly over its own NICs (gpu_nics): without PXN (no NVLink on a pcie8; NCCL routes
    an all-to-all's sends through another GPU's NIC only over NVLink) a GPU's sends leave by its
    own NIC, so on a pcie8 node GPUs 0, 1, 2 and 4 put 3/4 of their bytes on NIC 0, where an even
    split over the group's 2 NICs had put 1/2. The kit takes this on every preset, as
    _network_us's busiest-GPU term does; with NVLink, NCCL's PXN (NCCL_PXN_DISABLE, 0 by
    default in NCCL's environment-variable docs; it and NCCL_P2P_PXN_LEVEL are in libnccl
    2.32.3) may instead send a byte through a GPU on the NIC of the destination's rail, which
    for an uneven matrix (kit shard) puts the bytes by destination, not by source: not modelled
    (dgx1-v100 x2, rows of GPUs 0-3 x3: 17.86 ms here, 12.02 split evenly over the NICs)."""
    out: dict = {}
    for i, b in zip(local, per_gpu):
        own = gpu_nics(system, i)
        for j in own:
            out[j] = out.get(j, 0.0) + b / len(own)
    return out


def _network_us(system: System, per_gpu_bytes: float, per_node) -> list[float]:
    """The network's times (us) of an all-to-all(v): the busiest GPU's bytes off its node over
    its NIC share, and each node's (bytes, NICs the group has there) over those NICs."""
    net = system.network
    nic = net.nic_bw_gbs * net.efficiency * _NS
    return [per_gpu_bytes / (max(1.0, system.nics_per_gpu) * nic),
            *(b / (nics * nic) for b, nics in per_node)]


def alltoallv_us(system: System, group: Group, matrix: np.ndarray) -> float:
    """Bandwidth time (us) of one all-to-all(v): matrix[i, j] bytes go from group rank i to j.

    Transfers run concurrently, so the time is the busiest resource's: the max over ranks of the
    bytes each sends or receives over its fabric port and NIC share, over PCIe switch uplinks and
    the socket link, and over each NIC (the bytes of the GPUs on it, _nic_bytes).
    """
    import numpy as np

    x = np.array(matrix, dtype=float)
    np.fill_diagonal(x, 0.0)
    gpn = system.gpus_per_node
    ranks = np.array(group.ranks)
    node = ranks // gpn
    local = ranks % gpn
    same = node[:, None] == node[None, :]
    intra, inter = np.where(same, x, 0.0), np.where(same, 0.0, x)
    f = system.fabric
    times = [0.0]
    if intra.any():
        if f.kind == "nvswitch":
            port = system.gpu_bw_gbs * f.efficiency * _NS
            times.append(max(intra.sum(1).max(), intra.sum(0).max()) / port)
        else:
            # each pair on its own NVLink bundle when it has one; the rest goes over PCIe
            pair = np.zeros_like(intra)
            over_pcie = np.zeros_like(intra, dtype=bool)
            for i in range(len(ranks)):
                for j in range(len(ranks)):
                    if i != j and same[i, j] and intra[i, j] > 0:
                        nv = f.kind == "nvlink-mesh" and f.pair_links(local[i], local[j]) > 0
                        if nv:
                            pair[i, j] = intra[i, j] / (p2p_gbs(system, local[i], local[j]) * _NS)
                        else:
                            over_pcie[i, j] = True
            times.append(pair.max())
            if over_pcie.any():
                times.append(_pcie_us(system, np.where(over_pcie, intra, 0.0), node, local))
    if inter.any():  # each NIC: the bytes its GPUs send off the node, or receive (_nic_bytes)
        per_nic = []
        for nd, loc in group.nodes:
            here = node == nd
            out, into = _nic_bytes(system, loc, inter[here].sum(1)), _nic_bytes(system, loc, inter[:, here].sum(0))
            per_nic += [(max(out[j], into[j]), 1.0) for j in out]
        times += _network_us(system, max(inter.sum(1).max(), inter.sum(0).max()), per_nic)
    return float(max(times))


def _pcie_us(system: System, x: np.ndarray, node: np.ndarray, local: np.ndarray) -> float:
    """Busiest PCIe resource: a GPU's x16 link, a switch uplink, or the socket-to-socket link."""
    import numpy as np

    p = system.pcie
    link = p.link_bw_gbs * p.efficiency * _NS
    sock = p.socket_link_bw_gbs * p.efficiency * _NS
    times = [max(x.sum(1).max(), x.sum(0).max()) / link]
    sw = node * 1000 + local // p.gpus_per_switch
    so = node * 1000 + np.array([p.socket_of(int(v)) for v in local])
    for ids, bw in ((sw, link), (so, sock)):
        for u in np.unique(ids):
            inside = ids == u
            times.append(max(x[inside][:, ~inside].sum(), x[~inside][:, inside].sum()) / bw)
    return float(max(times))
