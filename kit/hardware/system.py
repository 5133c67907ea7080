"""A multi-GPU System: nodes x GPUs per node, the intra-node fabric, NICs and the inter-node network.

The numbers live in systems.json beside this module (every preset cites its sources). A System is
frozen and hashable, so the collective model can cache per (system, group) results.

    get_system("dgx-h100")                   # one box
    get_system("dgx-h100", nodes=4)          # 4 boxes over the preset's network (IB NDR)
    get_system("dgx-a100-roce-200g-x2")      # name form: <preset>[-<network>][-x<nodes>]
"""
from __future__ import annotations

import difflib
import json
import math
import re
import weakref
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from kit.errors import KitError

SYSTEMS_PATH = Path(__file__).with_name("systems.json")
FABRIC_KINDS = ("nvswitch", "nvlink-mesh", "pcie")


@dataclass(frozen=True)
class Network:
    """The inter-node network: one NIC's bandwidth (GB/s per direction) and a per-step latency."""

    key: str
    name: str
    nic_bw_gbs: float
    step_latency_us: float
    efficiency: float  # achieved fraction of line rate for large messages
    sharp: bool  # switches can reduce in the network (InfiniBand SHARP)
    source: str


@dataclass(frozen=True)
class Pcie:
    """PCIe tree of one node: GPUs hang off switches, switches off CPU sockets (root complexes)."""

    link: str  # "pcie3" | "pcie4" | "pcie5"
    link_bw_gbs: float  # one x16 link per direction
    efficiency: float
    step_latency_us: float
    gpus_per_switch: int
    switches_per_socket: int
    sockets: int
    socket_link_bw_gbs: float  # CPU-to-CPU link (QPI/UPI/xGMI) per direction

    def switch_of(self, local: int) -> int:
        return local // self.gpus_per_switch

    def socket_of(self, local: int) -> int:
        return local // (self.gpus_per_switch * self.switches_per_socket)


@dataclass(frozen=True)
class Fabric:
    """Intra-node GPU fabric. links: (a, b, n_links) for a mesh; NVSwitch gives every GPU
    links_per_gpu links into a non-blocking crossbar."""

    kind: str  # "nvswitch" | "nvlink-mesh" | "pcie"
    link: str  # "nvlink3", ... (for pcie: the PCIe generation)
    link_bw_gbs: float  # one link, per direction
    step_latency_us: float
    efficiency: float
    links_per_gpu: int = 0
    links: tuple[tuple[int, int, int], ...] = ()
    nvls: bool = False  # NVLink SHARP (multicast + in-switch reduction), NVSwitch gen 3+
    nvls_efficiency: float = 0.0

    def pair_links(self, a: int, b: int) -> int:
        for x, y, n in self.links:
            if {x, y} == {a, b}:
                return n
        return 0


@dataclass(frozen=True)
class System:
    key: str
    name: str
    gpu_key: str  # a GPU catalog key: get_gpu(system.gpu_key)
    nodes: int
    gpus_per_node: int
    fabric: Fabric
    pcie: Pcie
    nics_per_node: int  # rails
    network: Network
    software: tuple[tuple[str, float], ...]  # floor/latency constants, see systems.json "software"
    source: str
    aliases: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu(self):
        from kit.hardware.catalog import get_gpu

        return get_gpu(self.gpu_key)

    @property
    def gpu_bw_gbs(self) -> float:
        """Raw per-GPU fabric bandwidth to the rest of the node, per direction."""
        if self.fabric.kind == "nvswitch":
            return self.fabric.links_per_gpu * self.fabric.link_bw_gbs
        if self.fabric.kind == "nvlink-mesh":
            return max(sum(n for a, b, n in self.fabric.links if g in (a, b))
                       for g in range(self.gpus_per_node)) * self.fabric.link_bw_gbs
        return self.pcie.link_bw_gbs

    @property
    def nics_per_gpu(self) -> float:
        return self.nics_per_node / self.gpus_per_node

    def soft(self, name: str) -> float:
        return dict(self.software)[name]

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def describe(self) -> str:
        f = self.fabric
        fab = {"nvswitch": f"NVSwitch ({f.link}, {self.gpu_bw_gbs:.0f} GB/s/dir per GPU"
                           + (", NVLS" if f.nvls else "") + ")",
               "nvlink-mesh": f"NVLink mesh ({f.link}, {len(f.links)} GPU pairs)",
               "pcie": f"PCIe only ({self.pcie.link}, {self.pcie.sockets} sockets)"}[f.kind]
        net = (f", {self.nics_per_node}x {self.network.name}" if self.nodes > 1 or self.nics_per_node
               else "")
        return f"{self.nodes}x{self.gpus_per_node} {self.gpu_key}, {fab}{net}"

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "gpu": self.gpu_key, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "world_size": self.world_size,
                "fabric": self.fabric.kind, "link": self.fabric.link, "nvls": self.fabric.nvls,
                "gpu_fabric_bw_gbs": self.gpu_bw_gbs, "nics_per_node": self.nics_per_node,
                "network": self.network.key, "nic_bw_gbs": self.network.nic_bw_gbs,
                "sharp": self.network.sharp, "description": self.describe(), "source": self.source}


# -- loading -------------------------------------------------------------------------------------
def _num(d: dict, name: str, where: str, positive: bool = True) -> float:
    v = d.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        raise KitError(f"{where}: field {name} must be a {'positive' if positive else 'non-negative'}"
                       f" number, got {v!r}")
    return float(v)


@lru_cache(maxsize=1)
def _data() -> dict:
    try:
        return json.loads(SYSTEMS_PATH.read_text())
    except (OSError, json.JSONDecodeError) as e:  # a broken install, not a user error
        raise KitError(f"cannot read the system presets {SYSTEMS_PATH}: {e}") from None


@lru_cache(maxsize=None)
def _network(key: str) -> Network:
    nets = _data()["networks"]
    if key not in nets:
        raise KitError(f"unknown network {key!r}; known: {', '.join(sorted(nets))}")
    n = nets[key]
    where = f"network {key}"
    return Network(key=key, name=n["name"], nic_bw_gbs=_num(n, "nic_bw_gbs", where, False),
                   step_latency_us=_num(n, "step_latency_us", where, False),
                   efficiency=_num(n, "efficiency", where), sharp=bool(n["sharp"]),
                   source=n["source"])


def pcie_efficiency(gen: int) -> float:
    """The achievable share of a PCIe x16 link's rate, from the pcieN fabric of systems.json
    (the nearest generation listed, for one it does not list)."""
    fabrics = _data()["fabrics"]
    known = sorted(int(k[4:]) for k in fabrics if k.startswith("pcie"))
    return float(fabrics[f"pcie{min(max(int(gen), known[0]), known[-1])}"]["efficiency"])


def _link(key: str, where: str) -> dict:
    fabrics = _data()["fabrics"]
    if key not in fabrics:
        raise KitError(f"{where}: unknown link {key!r}; known: {', '.join(sorted(fabrics))}")
    return fabrics[key]


def system_from_dict(e: dict, nodes: int = 1, network: str | None = None) -> System:
    """Build a System from one systems.json entry (validated; problems are KitErrors)."""
    where = f"system {e.get('key', '?')}"
    g = int(_num(e, "gpus_per_node", where))
    f = e["fabric"]
    if f.get("kind") not in FABRIC_KINDS:
        raise KitError(f"{where}: fabric kind must be one of {', '.join(FABRIC_KINDS)}, got {f.get('kind')!r}")
    p = e["pcie"]
    pl = _link(p["link"], where)
    pcie = Pcie(link=p["link"], link_bw_gbs=pl["link_bw_gbs"], efficiency=pl["efficiency"],
                step_latency_us=pl["step_latency_us"], gpus_per_switch=int(p["gpus_per_switch"]),
                switches_per_socket=int(p["switches_per_socket"]), sockets=int(p["sockets"]),
                socket_link_bw_gbs=_num(p, "socket_link_bw_gbs", where))
    if f["kind"] == "pcie":
        fabric = Fabric(kind="pcie", link=pcie.link, link_bw_gbs=pcie.link_bw_gbs,
                        step_latency_us=pcie.step_latency_us, efficiency=pcie.efficiency)
    else:
        fl = _link(f["link"], where)
        links = tuple((int(a), int(b), int(n)) for a, b, n in f.get("links", ()))
        _check_links(links, g, where)
        fabric = Fabric(kind=f["kind"], link=f["link"], link_bw_gbs=fl["link_bw_gbs"],
                        step_latency_us=fl["step_latency_us"], efficiency=fl["efficiency"],
                        links_per_gpu=int(f.get("links_per_gpu", 0)), links=links,
                        nvls=bool(f.get("nvls", False)), nvls_efficiency=fl.get("nvls_efficiency", 0.0))
        if fabric.kind == "nvswitch" and fabric.links_per_gpu <= 0:
            raise KitError(f"{where}: an NVSwitch fabric needs links_per_gpu > 0")
    soft = {k: float(v) for k, v in _data()["software"].items() if k != "source"}
    soft.update({k: float(v) for k, v in e.get("software", {}).items()})
    net = network or e.get("network", "none")
    key = e["key"] if nodes == 1 and network is None else (
        f"{e['key']}{'-' + net if network else ''}{f'-x{nodes}' if nodes > 1 else ''}")
    return System(key=key, name=e["name"] + (f" x{nodes} nodes over {_network(net).name}" if nodes > 1 else ""),
                  gpu_key=e["gpu"], nodes=nodes, gpus_per_node=g, fabric=fabric, pcie=pcie,
                  nics_per_node=int(e.get("nics_per_node", 0)), network=_network(net),
                  software=tuple(sorted(soft.items())), source=e["source"],
                  aliases=tuple(e.get("aliases", ())))


def _check_links(links, gpus: int, where: str) -> None:
    """A KitError for an NVLink entry (a, b, count) that joins no two of the node's GPUs."""
    for a, b, n in links:
        if not (0 <= a < gpus and 0 <= b < gpus and a != b and n > 0):
            raise KitError(f"{where}: bad NVLink entry {[a, b, n]} for {gpus} GPUs")


def _check_nodes(n) -> None:
    if not 1 <= n <= MAX_NODES:  # '<preset>-x0' as well as nodes=0; a million GPUs at most
        raise KitError(f"nodes must be a whole number from 1 to {MAX_NODES:,}, got {n!r}")


_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _norm(name: str) -> str:
    """The name lower-cased, each run of other characters than a-z and 0-9 one '-', none at
    either end: re.sub(r"[^a-z0-9]+", "-", ...).strip("-") without a regex, whose compiling had
    been 0.04 ms of a fresh process's first collective prediction (and _nodes_suffix's 0.11)."""
    out, gap = [], False
    for c in name.lower():
        if c in _ALNUM:
            if gap and out:
                out.append("-")
            out.append(c)
            gap = False
        else:
            gap = True
    return "".join(out)


def _nodes_suffix(n: str) -> tuple[str, int] | None:
    r"""A normalised name's '<rest>-x<digits>' as (rest, nodes); None without one
    (re.fullmatch(r"(.+)-x(\d+)", n): the last '-x', as the greedy '.+' takes it)."""
    rest, sep, digits = n.rpartition("-x")
    if sep and rest and digits and digits.isascii() and digits.isdigit():
        return rest, int(digits)
    return None


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict]:
    out = {}
    for e in _data()["systems"]:
        for name in (e["key"], *e.get("aliases", ())):
            out[_norm(name)] = e
    return out


def _parse(name: str) -> tuple[dict, str | None, int]:
    """'<preset>[-<network>][-x<nodes>]' -> (entry, network or None, nodes)."""
    n = _norm(name)
    nodes = 1
    suffix = _nodes_suffix(n)
    if suffix:
        n, nodes = suffix
    if n in _entries():
        return _entries()[n], None, nodes
    for net in sorted(_data()["networks"], key=len, reverse=True):
        if n.endswith("-" + net) and n[: -len(net) - 1] in _entries():
            return _entries()[n[: -len(net) - 1]], net, nodes
    near = difflib.get_close_matches(n, list(_entries()), n=3, cutoff=0.4)
    hint = f"; close matches: {', '.join(near)}" if near else ""
    raise KitError(f"unknown system {name!r}{hint}; presets: {', '.join(list_systems())} "
                   f"(multi-node: '<preset>-x<nodes>' or '<preset>-<network>-x<nodes>', networks: "
                   f"{', '.join(k for k in _data()['networks'] if k != 'none')})")


def get_system(name: str | System, nodes: int | None = None, network: str | None = None) -> System:
    """A preset by name, optionally as `nodes` boxes over `network` (default: the preset's own)."""
    rescale = isinstance(name, System)  # a System to put on other nodes or another network
    if isinstance(nodes, bool) or not (nodes is None or isinstance(nodes, int)):
        raise KitError(f"nodes must be a whole number >= 1, got {nodes!r}")
    if rescale:
        own = not _vet(name)
        if nodes is None and network is None:
            return name
        if own:
            return _rescaled(name, nodes, network)
        name = name.key
    if not isinstance(name, str) or not name.strip():
        raise KitError(f"system name must be a non-empty string, got {name!r}")
    if not rescale and (nodes is not None or network is not None):
        _, net, n = _parse(name)
        said_nodes = _nodes_suffix(_norm(name)) is not None
        if nodes is not None and said_nodes and n != nodes:
            raise KitError(f"system {name!r} names {n} node(s), but nodes={nodes} (--nodes) was given; give one")
        if network is not None and net is not None and net != network:
            raise KitError(f"system {name!r} names network {net}, but network={network} (--network) was "
                           "given; give one")
    return _lookup(name, nodes, network)


MAX_NODES = 2**17  # x 8 GPUs: 1,048,576 ranks, beyond any cluster built (and rank lists stay small)


_vetted: dict = {}  # id(System) -> (a weak reference to it, whether it is a preset)


def _vet(system: System) -> bool:
    """Whether system is the preset its key names (as get_system builds it), else one of the
    caller's own (a preset's dataclasses.replace, or a System built by hand), checked by
    _check_own. Remembered per object, not per value: a value-keyed cache took a System equal to
    a preset or to one already passed, but for a field's type (gpus_per_node 8.0 == 8, nodes
    True == 1), as checked, and dgx1-v100 with 8.0 GPUs a node was a TypeError in the
    collective model. The weak reference tells a System from a later one at the same id."""
    hit = _vetted.get(id(system))
    if hit is not None and hit[0]() is system:
        return hit[1]
    try:
        preset = isinstance(system.key, str) and _identical(_lookup(system.key, None, None), system)
    except (KitError, TypeError):  # a key no preset has
        preset = False
    if not preset:
        _check_own(system)
    if len(_vetted) > 256:
        _vetted.clear()
    try:
        _vetted[id(system)] = (weakref.ref(system), preset)
    except TypeError:  # a subclass without weak references: checked every time
        pass
    return preset


def _identical(a, b) -> bool:
    """a == b with every field of the same type too (8 == 8.0 == True for ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (System, Fabric, Pcie, Network)):
        return all(_identical(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_identical, a, b))
    return a == b


def _check_own(s: System) -> None:
    """A KitError for a System of the caller's own that no box can be, as systems.json's presets
    are checked: 0 GPUs per node had been a ValueError (max() of nothing), a 0 GB/s link or a 0
    efficiency a ZeroDivisionError, a NaN link bandwidth an all-reduce of 1 GB in 0.08 ms and a
    misspelt fabric kind ("nvswich") priced as PCIe, 35.6 ms instead of 3.7."""
    where = f"system {getattr(s, 'key', '?')!r}"

    def whole(v, name: str, lo: int = 1, hi: int | None = None) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise KitError(f"{where}: {name} must be a whole number from {lo:,}"
                           + (f" to {hi:,}" if hi else " up") + f", got {v!r}")

    def rate(v, name: str, zero: bool = False, most: float | None = None) -> None:
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                or (v == 0 and not zero) or (most is not None and v > most)):
            raise KitError(f"{where}: {name} must be a {'non-negative' if zero else 'positive'} "
                           f"number{f' of at most {most:g}' if most else ''}, got {v!r}")

    if not isinstance(s.key, str) or not s.key.strip():  # named in messages, and rescaled by re
        raise KitError(f"{where}: key must be a non-empty string")
    whole(s.nodes, "nodes", 1, MAX_NODES)
    whole(s.gpus_per_node, "gpus_per_node")
    whole(s.nics_per_node, "nics_per_node", 0)
    f, p, n = s.fabric, s.pcie, s.network
    if f.kind not in FABRIC_KINDS:
        raise KitError(f"{where}: fabric kind must be one of {', '.join(FABRIC_KINDS)}, got {f.kind!r}")
    rate(f.link_bw_gbs, "fabric.link_bw_gbs")
    rate(f.efficiency, "fabric.efficiency", most=1)
    rate(f.step_latency_us, "fabric.step_latency_us", zero=True)
    if f.kind == "nvswitch":
        whole(f.links_per_gpu, "fabric.links_per_gpu (an NVSwitch fabric)")
    if f.nvls:
        rate(f.nvls_efficiency, "fabric.nvls_efficiency (NVLS on)", most=1)
    _check_links(f.links, s.gpus_per_node, where)
    rate(p.link_bw_gbs, "pcie.link_bw_gbs")
    rate(p.efficiency, "pcie.efficiency", most=1)
    rate(p.step_latency_us, "pcie.step_latency_us", zero=True)
    rate(p.socket_link_bw_gbs, "pcie.socket_link_bw_gbs")
    for name in ("gpus_per_switch", "switches_per_socket", "sockets"):
        whole(getattr(p, name), f"pcie.{name}")
    rate(n.nic_bw_gbs, "network.nic_bw_gbs", zero=s.nodes == 1)
    rate(n.efficiency, "network.efficiency", most=1)
    rate(n.step_latency_us, "network.step_latency_us", zero=True)
    # the collective model's constants, every one read (software=() had been a KeyError
    # 'base_latency_us' in predict_collective); a preset has systems.json's "software" ones
    try:
        soft = dict(s.software)
    except (TypeError, ValueError):
        raise KitError(f"{where}: software must be (name, number) pairs, got {s.software!r}") from None
    for name in _data()["software"]:
        if name != "source":
            rate(soft.get(name), f"software {name}", zero=True)


def _rescaled(system: System, nodes: int | None, network: str | None) -> System:
    """The caller's own System on `nodes` boxes over `network`, its GPU, fabric, PCIe tree and
    NICs kept. It had been looked up again by its key: a dgx-h100 given gpu_key "h200" came back
    on 2 nodes as the preset's H100 box (gpt2 dp=16: 17.6 ms, the preset's time, named
    dgx-h100-x2), and one under a key of its own was an unknown system."""
    from dataclasses import replace

    n = system.nodes if nodes is None else nodes
    _check_nodes(n)
    net = system.network if network is None else _network(network)
    if n > 1 and net.key == "none":
        raise KitError(f"{n} nodes of {system.key} need a network between them; pass network= one of "
                       + ", ".join(network_keys()))
    key = re.sub(r"-x\d+$", "", system.key)
    if net.key != system.network.key:
        key = f"{key.removesuffix('-' + system.network.key)}-{net.key}"
    name = re.sub(r" x\d+ nodes over .*$", "", system.name)
    return replace(system, key=key + (f"-x{n}" if n > 1 else ""), nodes=n, network=net,
                   name=name + (f" x{n} nodes over {net.name}" if n > 1 else ""))


@lru_cache(maxsize=512)
def _lookup(name: str, nodes: int | None, network: str | None) -> System:
    entry, net, n = _parse(name)
    n = nodes if nodes is not None else n
    _check_nodes(n)
    net = network if network is not None else net
    if net is not None:
        _network(net)
    if n > 1 and net == "none":  # asked for by name: the preset's own network is not the problem
        raise KitError(f"{n} nodes of {entry['key']} need a network between them, and network none "
                       "was asked for; name one of "
                       + ", ".join(k for k in _data()["networks"] if k != "none"))
    if n > 1 and (net or entry.get("network", "none")) == "none":
        raise KitError(f"system {entry['key']} has no network; pass network= one of "
                       + ", ".join(k for k in _data()["networks"] if k != "none"))
    return _build(entry["key"], n, net)


@lru_cache(maxsize=256)
def _build(key: str, nodes: int, network: str | None) -> System:
    return system_from_dict(_entries()[key], nodes=nodes, network=network)


def list_systems() -> list[str]:
    """Preset names (single node), plus a few named multi-node clusters."""
    keys = [e["key"] for e in _data()["systems"]]
    return keys + ["dgx-a100-ib-hdr-x4", "dgx-h100-ib-ndr-x4", "dgx-h100-roce-400g-x2"]


def network_keys() -> list[str]:
    return [k for k in _data()["networks"] if k != "none"]

