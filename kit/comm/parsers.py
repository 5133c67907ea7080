"""Read collective benchmarks into one tidy table, and write the nccl-tests text format.

Table columns: kind, ranks, nodes, size_bytes, count, dtype, time_us, algbw_gbs, busbw_gbs,
time_us_in_place, busbw_gbs_in_place, wrong, source, device. time_us is the out-of-place time (PARAM:
p50); nodes is the number of hosts the ranks ran on, empty (NaN) where the file does not say; device
is the device name the ranks' lines give ("NVIDIA A100-SXM4-40GB"; several, if they differ, joined
by "; ": read them with device_names), empty (None) where the file names none.

* nccl-tests (github.com/NVIDIA/nccl-tests) stdout: `#` comment lines, one row per size with
  size, count, type, [redop, root,] then time/algbw/busbw/#wrong out-of-place and in-place.
  count is nccl-tests' per-rank element count (its paramcount): for all-gather, reduce-scatter
  and all-to-all the size column is n ranks' worth of it; files an older `kit collect-comm` wrote
  with the total there are read as nccl-tests prints them (_kit_count).
  The collective comes from "# Collective test starting: all_reduce_perf" (or `kind=`), the rank
  count from the "#  Rank N" device lines (or `ranks=`), the nodes from the distinct hosts those
  lines name ("... Pid 4242 on node1 device 0 ..."), the device from the name that ends them
  ("device  0 [0x07] NVIDIA A100-SXM4-40GB"; `kit collect-comm` writes no bus id, and
  "[cpu] gloo process" for CPU ranks). Several runs may be concatenated.
* PARAM comms (github.com/facebookresearch/param, train/comms/pt/comms.py): "COMMS-RES" lines,
  a header naming size (B), num-elements, Latency(us):p50, p75, p95, [Min, Max,] algBW, busBW.
  The ranks come from `ranks=` or from busBW/algBW (the nccl-tests factor of the collective).
  A PARAM log names no GPU model (its ranks' device is "cuda:N"): its rows have no device.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from kit.comm.conventions import NCCL_TESTS_NAME, SPLIT_KINDS, WORD_BYTES, busbw_factor, canonical_kind
from kit.errors import KitError, refuse_device

COLUMNS = ["kind", "ranks", "nodes", "size_bytes", "count", "dtype", "time_us", "algbw_gbs", "busbw_gbs",
           "time_us_in_place", "busbw_gbs_in_place", "wrong", "source", "device"]

DEVICE_SEP = "; "  # between the names of a run whose ranks' devices differ

# "... device  0 [0x07] NVIDIA A100-SXM4-40GB", "[0000:07:00] ..." (a bus id, or none), then the name
_DEVICE = re.compile(r"\sdevice\s+\d+(?:\s+\[(?:0x)?[0-9a-fA-F:.]+\])?\s+(\S.*?)\s*$")


def device_name(rank_line: str) -> str | None:
    """The device a nccl-tests "#  Rank" line names, or None where it names none."""
    m = _DEVICE.search(rank_line)
    return m.group(1) if m else None


def joined_devices(names) -> str | None:
    """The device cell of a run's rows: its ranks' distinct device names (None where none)."""
    names = sorted({n for n in names if n})
    return DEVICE_SEP.join(names) if names else None


def device_names(table) -> list[str]:
    """The distinct device names a measurement table's rows carry (none without a device column)."""
    if "device" not in getattr(table, "columns", ()):
        return []
    cells = [c for c in table["device"].dropna().unique() if isinstance(c, str) and c]
    return sorted({n for c in cells for n in c.split(DEVICE_SEP) if n})


def _read(path) -> tuple[str, str]:
    path = Path(path)
    refuse_device(path, "benchmark file")
    try:
        return path.read_text(errors="replace"), str(path)
    except FileNotFoundError:
        raise KitError(f"benchmark file not found: {path}") from None
    except IsADirectoryError:
        raise KitError(f"{path} is a directory, expected a benchmark output file") from None


def _float(tok: str, where: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise KitError(f"{where}: expected a number, got {tok!r}") from None


def _time(tok: str, where: str) -> float:
    """A measured time: finite and >= 0 (a NaN or negative time is a corrupt row, not one to drop)."""
    t = _float(tok, where)
    if not 0 <= t < float("inf"):
        raise KitError(f"{where}: a time must be a finite number >= 0 us, got {tok!r}")
    return t


def _bandwidth(tok: str, where: str) -> float:
    """A bandwidth cell, GB/s: finite and >= 0 (a NaN or negative one is a corrupt row)."""
    b = _float(tok, where)
    if not 0 <= b < float("inf"):
        raise KitError(f"{where}: a bandwidth must be a finite number >= 0 GB/s, got {tok!r}")
    return b


def _whole(tok: str, where: str) -> int:
    if not tok.isdigit():
        raise KitError(f"{where}: expected a whole number >= 0, got {tok!r}")
    return int(tok)


def _wrong(tok: str, where: str) -> int:
    """A #wrong cell: "N/A" when nccl-tests ran without checking (-c 0). nccl-tests prints the
    count with %g (src/common.cu), so a million wrong elements or more read "1e+06" or
    "1.04858e+06"; those rows had been refused as malformed ("expected a whole number"),
    where `kit comm fit` says the run failed its own check."""
    if tok == "N/A":
        return 0
    if re.fullmatch(r"[0-9]+(?:\.[0-9]*)?[eE]\+?[0-9]{1,2}", tok):  # not 1e+400: inf
        return int(float(tok))
    return _whole(tok, where)


def _said_kind(given: str | None, said: str, where: str) -> str:
    """The collective a file names; kind= is for files that name none, and may not contradict one."""
    try:
        k = canonical_kind(said)
    except KitError:
        if given is not None:  # a name we do not know (gather_perf): kind= says what it is
            return given
        raise
    if given is not None and given != k:
        raise KitError(f"{where}: the file measures {k}, but kind={given} was given; drop kind= (--kind)")
    return k


def parse_nccl_tests(path, kind: str | None = None, ranks: int | None = None):
    """nccl-tests output -> tidy DataFrame (one row per size per run)."""
    import pandas as pd

    text, src = _read(path)
    kind = canonical_kind(kind) if kind else None
    rows, cur_kind, rank_lines, hosts, devices, section_ranks = [], kind, set(), {}, {}, None
    run_rows = 0  # result rows read since this run's "#  Rank" lines
    by_kit = False  # this run's header says `kit collect-comm` wrote it
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        m = re.match(r"#\s*Collective test starting:\s*(\S+)", s)
        if m:
            cur_kind = _said_kind(kind, m.group(1), f"{src} line {no}")
            rank_lines, hosts, devices, section_ranks, run_rows, by_kit = set(), {}, {}, None, 0, False
            continue
        if re.match(r"#\s*nThread\s", s) or (run_rows and re.match(r"#\s+Rank\s", s)):
            # a new run's header: older nccl-tests print no "Collective test starting" line, so
            # concatenated runs of 8 and 4 ranks had been read as one run of 8
            rank_lines, hosts, devices, section_ranks, run_rows = set(), {}, {}, None, 0
            by_kit = "# kit collect-comm " in s
        m = re.match(r"#\s+Rank\s+(\d+)\s", s)
        if m:
            if int(m.group(1)) in rank_lines:
                raise KitError(f"{src} line {no}: rank {m.group(1)} is listed twice in one run's "
                               "'#  Rank' device lines; the rank count would be wrong")
            rank_lines.add(int(m.group(1)))
            host = re.search(r"\son\s+(\S+)\s+device\s", s)
            if host:
                hosts[int(m.group(1))] = host.group(1)
            name = device_name(s)
            if name:
                devices[int(m.group(1))] = name
            continue
        if s.startswith("#"):
            continue
        tok = s.split()
        where = f"{src} line {no}"
        numeric = re.fullmatch(r"[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?", tok[0]) is not None
        if len(tok) < 11 or not tok[0].isdigit():
            if numeric and len(tok) >= 11:
                raise KitError(f"{where}: the size must be a whole number of bytes >= 0, got {tok[0]!r}")
            if numeric:
                raise KitError(f"{where}: a nccl-tests row needs size, count, type and 8 time/bandwidth "
                               f"columns, got {len(tok)} fields")
            continue  # other chatter (warnings, hostnames)
        if cur_kind is None:
            raise KitError(f"{src}: no '# Collective test starting:' line; pass kind= (CLI: --kind), e.g. allreduce")
        if ranks and rank_lines and ranks != len(rank_lines):
            raise KitError(f"{src}: ranks={ranks} given, but the file lists {len(rank_lines)} '#  Rank' "
                           "device lines; drop ranks= (CLI: --ranks) or fix the file")
        n = ranks or (len(rank_lines) if rank_lines else None)
        if n is None:
            raise KitError(f"{src}: no '#  Rank' device lines to count ranks; pass ranks= (CLI: --ranks)")
        section_ranks, run_rows = n, run_rows + 1
        oop, inp = tok[-8:-4], tok[-4:]
        nodes = len(set(hosts.values())) if rank_lines and len(hosts) == len(rank_lines) == n else None
        count = _whole(tok[1], where)
        if by_kit:
            count = _kit_count(cur_kind, int(tok[0]), count, tok[2], n)
        rows.append({"kind": cur_kind, "ranks": section_ranks, "nodes": nodes, "size_bytes": int(tok[0]),
                     "count": count, "dtype": tok[2], "time_us": _time(oop[0], where),
                     "algbw_gbs": _bandwidth(oop[1], where), "busbw_gbs": _bandwidth(oop[2], where),
                     "time_us_in_place": _time(inp[0], where), "busbw_gbs_in_place": _bandwidth(inp[2], where),
                     "wrong": _wrong(oop[3], where) + _wrong(inp[3], where), "source": src,
                     "device": joined_devices(devices.values())})
    if not rows:
        raise KitError(f"{src}: no nccl-tests result rows found (expected lines like "
                       "'  1048576  262144  float  sum  -1  44.2  23.7  ...')")
    return pd.DataFrame(rows, columns=COLUMNS)


def _kit_count(kind: str, size: int, count: int, dtype: str, n: int) -> int:
    """A `kit collect-comm` row's count as nccl-tests prints it (a rank's: size = n x count x 4 B
    for all-gather, reduce-scatter and all-to-all). Kits before 2026-12-07 wrote the total there
    (size = count x 4 B: 2048 for an 8 KiB all-gather on 2 ranks, where nccl-tests says 1024);
    on 2 ranks or more the two cannot be confused, so such a row is read as nccl-tests'."""
    if kind in SPLIT_KINDS and dtype == "float" and n > 1 and count * WORD_BYTES == size:
        return count // n
    return count


_PARAM_COL = re.compile(r"size\s*\(B\)|num-elements|Latency\(us\):p\d+|p\d+|Min|Max|algBW\(GB/s\)|busBW\(GB/s\)")


def _ranks_from_ratio(kind: str, pairs, where: str, half: float = 0.005) -> int:
    """The rank count n whose busbw factor (2(n-1)/n, or (n-1)/n) every (algBW, busBW) pair
    agrees with, each value known to +-half (PARAM prints 2 decimals). Every pair bounds n; the
    bounds of all pairs must leave exactly one whole n >= 2 (a single ratio is too coarse beyond
    a few ranks: algBW 4.97, busBW 9.79 reads as 66 ranks for 64)."""
    top = 2.0 if kind == "allreduce" else 1.0
    lo, hi = 2.0, math.inf
    for alg, bus in pairs:
        if not (alg > half and bus > half):
            continue
        r_lo, r_hi = (bus - half) / (alg + half), (bus + half) / (alg - half)
        lo = max(lo, top / (top - r_lo) if r_lo < top else math.inf)
        hi = min(hi, top / (top - r_hi) if r_hi < top else math.inf)
    if lo > hi:
        seen = "no rank count"
    elif hi == math.inf:
        seen = f"{math.ceil(lo - 1e-9)} ranks or more"
    else:
        fits = list(range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1))
        if len(fits) == 1:
            return fits[0]
        seen = f"{fits[0]} to {fits[-1]} ranks" if fits else "no rank count"
    raise KitError(f"{where}: cannot infer the rank count of {kind} from busBW/algBW (they fit {seen}); "
                   "pass ranks= (CLI: --ranks)")


def parse_param(path, kind: str | None = None, ranks: int | None = None):
    """PARAM comms benchmark output -> tidy DataFrame."""
    import pandas as pd

    text, src = _read(path)
    kind = canonical_kind(kind) if kind else None
    rows, cols, cur_kind = [], None, kind
    for no, line in enumerate(text.splitlines(), 1):
        if "COMMS-RES" not in line:
            continue
        head, _, rest = line.strip().partition(" ")
        m = re.match(r"COMMS-RES-([A-Za-z_0-9]+?)(?:-[a-z]+\d*)?$", head)
        if m:
            cur_kind = _said_kind(kind, m.group(1), f"{src} line {no}")
        if re.search(r"size", rest) and re.search(r"Latency|algBW", rest):
            cols = [(c.split(":")[-1] if ":" in c else c.split("(")[0]).lower().replace(" ", "")
                    for c in _PARAM_COL.findall(rest)]
            continue
        if cols is None:
            raise KitError(f"{src} line {no}: COMMS-RES data before its header line")
        vals = rest.split()
        where = f"{src} line {no}"
        if len(vals) < len(cols):
            raise KitError(f"{where}: expected {len(cols)} values ({', '.join(cols)}), got {len(vals)}")
        rec = dict(zip(cols, (_float(v, where) for v in vals)))
        if cur_kind is None:
            raise KitError(f"{src}: the COMMS-RES tag names no collective; pass kind=")
        t = rec.get("p50", rec.get("latency"))
        if t is None or "size" not in rec:
            raise KitError(f"{src}: the PARAM header lacks size (B) or Latency(us):p50")
        t = _time(vals[cols.index("p50" if "p50" in rec else "latency")], where)
        size, count = rec["size"], rec.get("num-elements", 0.0)
        if not (math.isfinite(size) and size >= 0 and size == int(size)):
            raise KitError(f"{where}: the size must be a whole number of bytes >= 0, got {size:g}")
        if not (math.isfinite(count) and count >= 0 and count == int(count)):
            raise KitError(f"{where}: num-elements must be a whole number >= 0, got {count:g}")
        for col in ("algbw", "busbw"):
            if col in rec:
                _bandwidth(vals[cols.index(col)], where)
        rows.append({"kind": cur_kind, "ranks": ranks, "size_bytes": int(size),
                     "count": int(count), "dtype": "", "time_us": t,
                     "algbw_gbs": rec.get("algbw", float("nan")), "busbw_gbs": rec.get("busbw", float("nan")),
                     "time_us_in_place": float("nan"), "busbw_gbs_in_place": float("nan"), "wrong": 0,
                     "source": src, "device": None})
    if not rows:
        raise KitError(f"{src}: no PARAM 'COMMS-RES' result lines found")
    if ranks is None:  # from busBW/algBW, which PARAM prints with 2 decimals
        for kind in {r["kind"] for r in rows}:
            mine = [r for r in rows if r["kind"] == kind]
            if kind in ("broadcast", "reduce", "sendrecv"):
                raise KitError(f"{src}: cannot infer the rank count of {kind} from its bandwidths; pass ranks= (CLI: --ranks)")
            n = _ranks_from_ratio(kind, [(r["algbw_gbs"], r["busbw_gbs"]) for r in mine], src)
            for r in mine:
                r["ranks"] = n
    return pd.DataFrame(rows, columns=COLUMNS)


def read_measurements(path, fmt: str = "auto", kind: str | None = None, ranks: int | None = None):
    """Either format; 'auto' looks for COMMS-RES lines."""
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        raise KitError(f"ranks must be a whole number >= 1, got {ranks!r}")
    if fmt not in ("auto", "nccl-tests", "param"):
        raise KitError(f"unknown benchmark format {fmt!r}; choose auto, nccl-tests or param")
    if fmt == "auto":
        text, _ = _read(path)
        fmt = "param" if "COMMS-RES" in text else "nccl-tests"
    return (parse_param if fmt == "param" else parse_nccl_tests)(path, kind=kind, ranks=ranks)


_HEADER = ("#\n#{:>80}{:>38}\n".format("out-of-place", "in-place")
           + "#{:>11}{:>14}{:>10}{:>8}{:>8}{:>9}{:>8}{:>8}{:>7}{:>9}{:>8}{:>8}{:>7}\n".format(
               "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
               "time", "algbw", "busbw", "#wrong")
           + "#{:>11}{:>14}{:>26}{:>9}{:>8}{:>8}{:>7}{:>9}{:>8}{:>8}\n".format(
               "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)"))


def format_nccl_tests(rows, kind: str, ranks: int, devices: list[str], meta: str = "") -> str:
    """One nccl-tests section: rows are dicts with size_bytes, count, dtype, time_us, wrong."""
    kind = canonical_kind(kind)
    f = busbw_factor(kind, ranks)
    redop = "sum" if kind in ("allreduce", "reducescatter", "reduce") else "none"
    root = "0" if kind in ("broadcast", "reduce") else "-1"
    sizes = [r["size_bytes"] for r in rows]
    out = [f"# Collective test starting: {NCCL_TESTS_NAME[kind]}",
           f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} {meta}".rstrip(),
           "#", "# Using devices"]
    out += [f"#  Rank {i:2d} Group  0 {d}" for i, d in enumerate(devices)]
    text = "\n".join(out) + "\n" + _HEADER
    bus_sum = 0.0
    for r in rows:
        t = r["time_us"]
        alg = r["size_bytes"] / t / 1e3 if t > 0 else 0.0
        bus_sum += alg * f
        cells = " {:>8.2f} {:>7.2f} {:>7.2f}{:>7d}".format(t, alg, alg * f, int(r.get("wrong", 0)))
        text += "{:>12}{:>14}{:>10}{:>8}{:>8}".format(r["size_bytes"], r["count"], r["dtype"], redop,
                                                      root) + cells + cells + "\n"
    text += f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {bus_sum / len(rows):.4f} \n#\n"
    return text
