"""Where a group of ranks sits on a System, and the bandwidths its links give it.

All bandwidths here are achieved GB/s per direction (link rate x efficiency). Results are cached
per (system, group), so a repeated prediction costs microseconds.
"""
from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from kit.errors import KitError
from kit.hardware.system import System
from kit.numpy_free import is_int

if TYPE_CHECKING:  # numpy is imported where it is used: only a mesh's ring program (a DGX-1) needs it
    import numpy as np


@dataclass(frozen=True)
class Group:
    ranks: tuple[int, ...]  # global ranks, sorted
    nodes: tuple[tuple[int, tuple[int, ...]], ...]  # (node, local GPU indices) per node spanned

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def max_per_node(self) -> int:
        return max(len(loc) for _, loc in self.nodes)


def resolve_group(system: System, ranks=None) -> Group:
    """None -> every rank; an int n -> ranks 0..n-1 (filling nodes in order); a list -> those ranks."""
    if isinstance(ranks, (list, tuple)):
        try:
            return _resolve(system, tuple(ranks))
        except TypeError:  # unhashable members: let _resolve_group explain
            pass
    elif ranks is None or isinstance(ranks, int):
        return _resolve(system, ranks)
    return _resolve_group(system, ranks)


@lru_cache(maxsize=4096)
def _resolve(system: System, ranks) -> Group:
    return _resolve_group(system, ranks)


def _resolve_group(system: System, ranks) -> Group:
    world = system.world_size
    if ranks is None:
        chosen = tuple(range(world))
    elif is_int(ranks) and not isinstance(ranks, bool):
        if not 1 <= ranks <= world:
            raise KitError(f"ranks={ranks} does not fit {system.key}: it has {world} GPUs "
                           f"({system.nodes} node(s) x {system.gpus_per_node}); use nodes= (--nodes) for more")
        chosen = tuple(range(int(ranks)))
    else:
        try:
            if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in ranks):
                raise ValueError  # int(0.5) would take rank 0: a rank id is a whole number
            chosen = tuple(sorted(int(r) for r in ranks))
        except (TypeError, ValueError):
            raise KitError(f"ranks must be None, a count or a list of whole rank ids, got {ranks!r}") from None
        if not chosen:
            raise KitError("ranks is an empty list; a group needs at least one rank")
        if len(set(chosen)) != len(chosen):
            raise KitError(f"ranks has duplicates: {list(ranks)}")
        bad = [r for r in chosen if not 0 <= r < world]
        if bad:
            raise KitError(f"rank(s) {bad} outside {system.key}, whose ranks are 0..{world - 1}")
    per_node: dict[int, list[int]] = {}
    for r in chosen:
        per_node.setdefault(r // system.gpus_per_node, []).append(r % system.gpus_per_node)
    return Group(ranks=chosen, nodes=tuple((n, tuple(loc)) for n, loc in sorted(per_node.items())))


def _gbs_to_bytes_per_us(gbs: float) -> float:
    return gbs * 1e3


# -- intra-node ---------------------------------------------------------------------------------
def pcie_path_gbs(system: System, a: int, b: int) -> float:
    """GPU a -> GPU b through the PCIe tree (same switch, across the root complex, across sockets)."""
    p = system.pcie
    bw = p.link_bw_gbs
    if p.socket_of(a) != p.socket_of(b):
        bw = min(bw, p.socket_link_bw_gbs)
    return bw * p.efficiency


def p2p_gbs(system: System, a: int, b: int) -> float:
    """Achieved bandwidth of one direct transfer between local GPUs a and b."""
    f = system.fabric
    if f.kind == "nvswitch":
        return system.gpu_bw_gbs * f.efficiency
    if f.kind == "nvlink-mesh":
        n = f.pair_links(a, b)
        if n:
            return n * f.link_bw_gbs * f.efficiency
    return pcie_path_gbs(system, a, b)


def _pcie_ring_gbs(system: System, local: tuple[int, ...]) -> float:
    # A ring ordered by switch crosses every switch uplink and the socket link once per direction.
    p = system.pcie
    bw = p.link_bw_gbs
    if len({p.socket_of(g) for g in local}) > 1:
        bw = min(bw, p.socket_link_bw_gbs)
    return bw * p.efficiency


def _mesh_ring_gbs(system: System, local: tuple[int, ...]) -> float:
    """Best total rate of concurrent directed rings (Hamiltonian cycles over NVLink) within the
    link capacities: a small linear program, as NCCL spreads channels over several rings."""
    f = system.fabric
    # Links are the same both ways, so some optimum runs every ring in both directions at the same
    # rate (average any optimum with its mirror image): pack undirected cycles into undirected
    # link capacities and count each twice. Exact, and a quarter of the directed program.
    pairs = [(a, b) for i, a in enumerate(local) for b in local[i + 1:]]
    links = {e: f.pair_links(*e) for e in pairs}
    nbrs = {a: [b for b in local if b != a and f.pair_links(a, b)] for a in local}
    cycles = [c for c in _hamiltonian_cycles(local, nbrs) if c[1] < c[-1]]  # one per direction pair
    if not cycles:
        return 0.0
    import numpy as np

    edges = {e: i for i, e in enumerate(pairs)}
    a_ub = np.zeros((len(edges), len(cycles)))
    for j, order in enumerate(cycles):
        for i in range(len(order)):
            a, b = order[i], order[(i + 1) % len(order)]
            a_ub[edges[(a, b) if (a, b) in edges else (b, a)], j] = 1.0
    b_ub = np.array([links[e] * f.link_bw_gbs for e in pairs])
    return 2.0 * max_packing(a_ub, b_ub) * f.efficiency


def _hamiltonian_cycles(nodes: tuple[int, ...], nbrs: dict) -> list[tuple[int, ...]]:
    """Every directed Hamiltonian cycle starting at nodes[0] (depth-first over the links)."""
    first, n, out = nodes[0], len(nodes), []

    def walk(path, seen):
        if len(path) == n:
            if first in nbrs[path[-1]]:
                out.append(tuple(path))
            return
        for b in nbrs[path[-1]]:
            if b not in seen:
                seen.add(b)
                path.append(b)
                walk(path, seen)
                path.pop()
                seen.discard(b)

    walk([first], {first})
    return out


def max_packing(a: np.ndarray, b: np.ndarray) -> float:
    """max sum(x) subject to a @ x <= b, x >= 0, for a >= 0 and b >= 0: the primal simplex from the
    all-slack basis (feasible since b >= 0) with Bland's rule, which cannot cycle. Here instead of
    scipy's linprog so that predicting never imports scipy (a fresh import costs about a second)."""
    import numpy as np

    m, n = a.shape
    tab = np.zeros((m + 1, n + m + 1))
    tab[:m, :n], tab[:m, n:n + m], tab[:m, -1] = a, np.eye(m), b
    tab[m, :n] = -1.0  # reduced costs of maximising sum(x)
    basis = list(range(n, n + m))
    eps = 1e-12
    for _ in range(50 * (n + m)):
        entering = np.flatnonzero(tab[m, :-1] < -eps)
        if entering.size == 0:
            return float(tab[m, -1])
        col = int(entering[0])
        rows = np.flatnonzero(tab[:m, col] > eps)
        if rows.size == 0:
            return math.inf  # unbounded: a column with no positive entry
        ratio = tab[rows, -1] / tab[rows, col]
        ties = rows[ratio <= ratio.min() + eps]
        row = int(min(ties, key=lambda r: basis[r]))
        tab[row] /= tab[row, col]
        others = np.arange(m + 1) != row
        tab[others] -= np.outer(tab[others, col], tab[row])
        basis[row] = col
    raise RuntimeError("simplex did not converge")  # pragma: no cover - Bland's rule terminates


@lru_cache(maxsize=4096)
def ring_gbs(system: System, local: tuple[int, ...]) -> float:
    """Per-GPU egress rate a ring collective over these local GPUs achieves (GB/s)."""
    if len(local) < 2:
        return math.inf
    f = system.fabric
    if f.kind == "nvswitch":
        return system.gpu_bw_gbs * f.efficiency
    if f.kind == "nvlink-mesh":
        if len(local) == 2:
            return p2p_gbs(system, *local)
        bw = _mesh_ring_gbs(system, local)
        if bw > 0:
            return bw
    return _pcie_ring_gbs(system, local)


def nvls_gbs(system: System) -> float:
    """NVLink SHARP rate per GPU (all-reduce moves each byte once out and once in)."""
    f = system.fabric
    return system.gpu_bw_gbs * f.nvls_efficiency if f.nvls else 0.0


# -- inter-node -----------------------------------------------------------------------------------
def node_nics(system: System, gpus_in_group: int) -> int:
    """NICs a node uses for a group with this many of its GPUs (rail-aligned: the GPUs' own NICs)."""
    r = system.nics_per_node
    if r <= 0:
        raise KitError(f"{system.key} has no NICs, so its nodes cannot talk to each other")
    return min(r, max(1, math.ceil(gpus_in_group * r / system.gpus_per_node)))


def node_net_gbs(system: System, group: Group, sharing=1) -> float:
    """Slowest node's achieved network egress for this group (GB/s). sharing: the groups of a
    node that cross nodes at the same time, this one included: a count of groups each placed as
    this one, or the local GPUs of each (shared_nics). A NIC's line rate caps the flows through
    it, whoever's they are. A tuple gives each of the group's nodes (group.nodes' order) its
    own: the busiest node's count applied to every node had halved a pcie8 TP group's NICs at
    tp 6 on the node where it alone crosses (ranks 6-11: 2 groups cross on node 1, only it on
    node 0)."""
    n = system.network
    return min(nics for _, nics in nics_by_node(system, group, sharing)) * n.nic_bw_gbs * n.efficiency


def nics_by_node(system: System, group: Group, sharing=1) -> list[tuple[int, float]]:
    """(the group's GPUs on the node, the NICs it gets there: shared_nics) for each node of the
    group, in group.nodes' order; sharing as node_net_gbs takes it (one for every node, or a
    tuple of one a node)."""
    counts = sharing if isinstance(sharing, tuple) else (sharing,) * group.n_nodes
    return [(len(loc), shared_nics(system, loc, s)) for s, (_, loc) in zip(counts, group.nodes)]


def gpu_nics(system: System, local: int) -> range:
    """The NICs of its node that local GPU `local` sends through (rail-aligned: the NICs on its
    own PCIe switch). With r NICs for g GPUs, r <= g: NIC local x r // g, each NIC serving g / r
    consecutive GPUs (a DGX-1's 4 PCIe switches each hold 2 V100s and 1 EDR NIC, WP-08437-002);
    r > g: its r / g own NICs."""
    r, g = system.nics_per_node, system.gpus_per_node
    if r <= 0:
        raise KitError(f"{system.key} has no NICs, so its nodes cannot talk to each other")
    first = local * r // g
    return range(first, max(first + 1, (local + 1) * r // g))


@lru_cache(maxsize=4096)
def group_nics(system: System, local: tuple[int, ...]) -> frozenset:
    """The NICs a node's GPUs `local` of one communicator use: those of each (gpu_nics). NCCL
    builds a channel through each NIC its GPUs reach at full PCIe bandwidth, so a group of
    local GPUs 0, 2, 4, 6 of a DGX-1 uses all 4 NICs, where ceil(4 x 4 / 8) = 2 had counted
    the NICs of 4 GPUs packed onto the fewest NICs."""
    return frozenset(j for i in local for j in gpu_nics(system, i))


def shared_nics(system: System, local: tuple[int, ...], sharing=1) -> float:
    """NICs a group with these local GPUs on a node gets there when other groups cross nodes
    from that node at the same time. sharing: 1, alone (the NICs of its GPUs, group_nics); a
    count s > 1 of groups placed alike (it included), which together use the NICs of s x its
    GPUs (node_nics) and split them evenly; or the local GPUs of each concurrent group on the
    node (it included): each group spreads its channels evenly over its NICs, each NIC's rate is
    split evenly among the groups using it, and a group goes at its slowest NIC's share times
    its NICs (its channels carry equal bytes). Counts had split the node's NICs evenly however
    the groups sat: at tp 3 on DGX-1 nodes (2 GPUs a NIC) the TP groups of ranks 6-8 and 15-17
    (locals 0 and 7 on node 1, NICs 0 and 3) had each been given half a NIC, where each has a
    NIC of its own."""
    if isinstance(sharing, tuple):
        shares = nic_shares(system, local, sharing)
        return len(shares) * min(shares.values())
    if sharing == 1:
        return float(len(group_nics(system, tuple(local))))
    return node_nics(system, sharing * len(local)) / sharing


def nic_shares(system: System, local, sharing) -> dict:
    """NIC -> the share of it a group with these local GPUs gets: 1 alone (sharing not a tuple),
    else 1 / the groups using it, sharing giving the local GPUs of each concurrent group on the
    node (shared_nics; the group itself counted once, given or not)."""
    mine = group_nics(system, tuple(local))
    if not isinstance(sharing, tuple):
        return {j: 1.0 for j in mine}
    groups = [tuple(g) for g in sharing]
    if tuple(local) not in groups:
        groups.append(tuple(local))
    load = Counter(j for g in groups for j in group_nics(system, g))
    return {j: 1.0 / load[j] for j in mine}


@lru_cache(maxsize=4096)
def group_ring_gbs(system: System, group: Group) -> float:
    """Slowest node's intra-node ring rate for the group."""
    return min(ring_gbs(system, loc) for _, loc in group.nodes)
