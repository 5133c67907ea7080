"""A system's fitted bandwidth curves (Calibration), keyed by collective, ranks and nodes: the
JSON file `kit comm fit` writes and load_calibration reads, fit_table (one curve per group of a
measurement table, kit.comm.curves.fit_curve), and the checks that a calibration can describe
the transfers of a system.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kit.comm.conventions import canonical_kind
from kit.comm.curves import BandwidthCurve, curve_from_dict, fit_curve
from kit.errors import KitError, need_path, refuse_device
from kit.whole_file import replace_file

CALIBRATION_FORMAT = "kit-comm-calibration"


@dataclass(frozen=True)
class Calibration:
    """Fitted curves for one system, keyed by (kind, ranks, nodes spanned).

    A group of 8 ranks in one node and one split over two nodes run at different speeds, so a
    curve whose nodes are known answers only for groups spanning that many nodes; a curve
    whose nodes are not known (0) answers for any group of its rank count."""

    system: str
    curves: tuple[BandwidthCurve, ...]
    source: str = ""

    def curve(self, kind: str, ranks: int, nodes: int | None = None) -> BandwidthCurve | None:
        """The curve for `ranks` ranks spanning `nodes` nodes (None: any), else None. A curve
        measured on exactly that many nodes comes before one whose nodes are not known."""
        kind = canonical_kind(kind)
        same = [c for c in self.curves if c.kind == kind and c.ranks == ranks]
        if nodes is None:
            return same[0] if same else None
        return next((c for c in same if c.nodes == nodes), None) or next((c for c in same if not c.nodes), None)

    def to_dict(self) -> dict:
        return {"format": CALIBRATION_FORMAT, "version": 1, "system": self.system,
                "source": self.source, "curves": [c.to_dict() for c in self.curves]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        try:  # whole or not at all: a failed write leaves an earlier calibration as it was
            replace_file(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())
        except OSError as e:
            raise KitError(f"cannot write the calibration to {path}: {e.strerror or e}") from None
        return path


NOISY_FIT_MAPE = 0.5  # a fit off by more than half on its own points: said, not refused
PLATEAU_HEADROOM = 2.0  # busbw above twice a GPU's own links (NVLS, SHARP reduce in the switch)


def check_plausible(cal: Calibration, system) -> None:
    """KitError when a calibration cannot describe real transfers on `system` (a kit System):
    a plateau busbw above PLATEAU_HEADROOM x the GPU's fabric or network bandwidth (times that
    do not grow with size, or shrink); for a one-rank curve, x the copy rate of its memory. A
    noisy fit (measurements on a loaded host) is not refused here: `kit comm fit` reports each
    curve's fit error and notes those above NOISY_FIT_MAPE."""
    from kit.comm.algorithms import LOCAL_COPY_BYTES_PER_BYTE

    per_gpu = max(system.gpu_bw_gbs, system.network.nic_bw_gbs * system.nics_per_gpu)
    # one rank crosses no link: its collective copies the buffer in its own memory, as the
    # preset's "local" plan has it (2 bytes of HBM a byte). Held to the links, a one-rank
    # nccl-tests run (all_reduce_perf -g 1) on an H100 had been refused: its 1,676 GB/s copy
    # rate is over 2 x 450 GB/s of NVLink, and the kit's own preset predicts that rate
    copy = system.gpu.mem_bw_gbs / LOCAL_COPY_BYTES_PER_BYTE
    where = cal.source or "the calibration"
    for c in cal.curves:
        regime, name = c, f"{c.kind} x{c.ranks}"
        most, what = (copy, "a one-rank copy in") if c.ranks == 1 else (per_gpu, "a GPU of")
        while regime is not None:
            if regime.busbw_max_gbs > PLATEAU_HEADROOM * most:
                raise KitError(f"{where}: {name} fits a busbw plateau of {regime.busbw_max_gbs:,.0f} GB/s, "
                               f"more than {PLATEAU_HEADROOM:g}x the {most:,.0f} GB/s {what} "
                               f"{system.key} can move: the times do not grow with size as transfers' "
                               "do; check the measurements (and --system)")
            regime = regime.upper


SLOW_PLATEAU_SHARE = 0.25  # a plateau under a quarter of the slowest link a GPU of the system has


def slow_curves(cal: Calibration, system) -> list[str]:
    """The curves whose plateau busbw is under SLOW_PLATEAU_SHARE of the slowest link a GPU of
    `system` has (its fabric, or its share of the NICs): measured elsewhere (CPU processes with
    gloo reach a few GB/s), or on a loaded host. Said, not refused: a user may mean it."""
    slowest = min(system.gpu_bw_gbs, system.network.nic_bw_gbs * system.nics_per_gpu)
    out = []
    for c in cal.curves:
        top = c
        while top.upper is not None:
            top = top.upper
        if top.busbw_max_gbs < SLOW_PLATEAU_SHARE * slowest:
            out.append(f"{c.kind} x{c.ranks} plateaus at {top.busbw_max_gbs:.3g} GB/s, under "
                       f"{SLOW_PLATEAU_SHARE:g}x the {slowest:.3g} GB/s of {system.key}'s slowest link "
                       f"a GPU has: measured on another machine (CPU processes with gloo?); "
                       f"predictions with it will be that slow")
    return out


def extrapolation_note(curve: BandwidthCurve, sizes) -> str | None:
    """A note where any of `sizes` (bytes) is outside the sizes `curve` was fitted to (its
    min_bytes and max_bytes; a curve that does not record them gets none): not an error, the
    fitted curve goes on. Past the largest, its time grows in proportion to the size at its last
    regime's plateau busbw. Below the smallest, it runs down to the time of a vanishing message
    (latency_us: the floor, or f*S_half/B where that is larger), which measurements that never get
    there do not tell: fitted from 128 MiB up on vTrain's 8-GPU A100 all-reduce, that is the 128 MiB
    time, and 1 MiB was predicted in 1,162 us (measured: 93 us) without a word. The floor alone is
    not that time: fitted from 1 KiB with a sharp knee (k = 2), a floor of 0.96 us sat under a
    latency of 19.9 us, which every smaller size took."""
    past = sorted(float(s) for s in sizes if curve.max_bytes and s > curve.max_bytes)
    below = sorted(float(s) for s in sizes if curve.min_bytes and s < curve.min_bytes)
    out = []
    if past:
        out.append(f"{_sizes_are(past)} past the calibrated range ({curve.kind} x{curve.ranks} measured up to "
                   f"{curve.max_bytes / 2**20:,.4g} MiB): extrapolated along the fitted curve, its time growing "
                   f"with the size at a busbw approaching its plateau of {curve.plateau_gbs():,.4g} GB/s")
    if below:
        out.append(f"{_sizes_are(below)} below the calibrated range ({curve.kind} x{curve.ranks} measured from "
                   f"{curve.min_bytes / 2**20:,.4g} MiB): extrapolated along the fitted curve, which levels "
                   f"off at {curve.latency_us():,.4g} us for the smallest messages, a time no measurement "
                   "that small checks")
    return "; ".join(out) or None


def _sizes_are(sizes: list[float]) -> str:
    """'1 MiB is' or '3 sizes, 1 to 4 MiB, are', for sizes sorted."""
    return (f"{sizes[0] / 2**20:,.4g} MiB is" if len(sizes) == 1 else
            f"{len(sizes)} sizes, {sizes[0] / 2**20:,.4g} to {sizes[-1] / 2**20:,.4g} MiB, are")


def check_measured_gpu(table, system, where: str = "", any_gpu: bool = False) -> list[str]:
    """KitError when the device names a measurement table carries (the "#  Rank" lines of a
    nccl-tests or `kit collect-comm` file; kit.comm.parsers.device_names) map to a catalog GPU
    other than `system`'s (a kit System): curves fitted to another GPU's links would be saved as
    this system's. any_gpu=True (CLI: --any-gpu) fits them anyway, with a note. Returns the notes
    to show: names the catalog cannot map ("[cpu] gloo process"), which are not checked, and
    GPUs let through by any_gpu. A table naming no device (PARAM logs, bare files) passes."""
    from kit.comm.parsers import device_names
    from kit.hardware import get_gpu

    where = where or "the measurements"
    notes, unknown = [], []
    for name in device_names(table):
        try:
            key = get_gpu(name).key
        except KitError:
            unknown.append(repr(name))
            continue
        if key == system.gpu_key:
            continue
        if any_gpu:
            notes.append(f"{where}: measured on {name} ({key}), fitted to {system.key} ({system.gpu_key}) "
                         "anyway, as --any-gpu asks")
            continue
        raise KitError(f"{where}: measured on {name} ({key}), but --system {system.key} has "
                       f"{system.gpu_key}; {_fit_on(key, system.key)}")
    if unknown:
        notes.append(f"{where}: its device lines name {', '.join(unknown)}, not a GPU in the catalog: "
                     f"not checked against {system.key}'s {system.gpu_key}")
    return notes


def _fit_on(gpu_key: str, asked: str) -> str:
    """How to fit measurements of gpu_key: the single-node presets built of it, else --any-gpu."""
    from kit.hardware.system import get_system, list_systems

    presets = [n for n, s in ((n, get_system(n)) for n in list_systems()) if s.nodes == 1 and s.gpu_key == gpu_key]
    if presets:
        return (f"pass the system it ran on (--system {' or '.join(presets)}), or --any-gpu to fit it "
                f"to {asked} anyway")
    return (f"no preset is built of {gpu_key} (`kit systems`): pass --any-gpu to fit it to {asked} "
            "anyway, if the two boxes differ only in what collectives do not use (memory size)")


def load_calibration(path: str | Path | Calibration) -> Calibration:
    if isinstance(path, Calibration):
        return path
    path = Path(need_path(path, "the calibration file"))
    refuse_device(path, "calibration file")
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise KitError(f"calibration file not found: {path}") from None
    except IsADirectoryError:
        raise KitError(f"calibration {path} is a folder; give the JSON file `kit comm fit --out` wrote") from None
    except UnicodeDecodeError:
        raise KitError(f"calibration file {path} holds binary data, not JSON text; give the file "
                       "`kit comm fit --out` wrote") from None
    except (OSError, json.JSONDecodeError) as e:
        raise KitError(f"calibration file {path} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or d.get("format") != CALIBRATION_FORMAT:
        raise KitError(f"{path} is not a kit calibration (expected format {CALIBRATION_FORMAT!r}; "
                       "make one with `kit comm fit`)")
    listed = d.get("curves")
    if not isinstance(listed, list):
        raise KitError(f"calibration {path}: 'curves' must be a list of fitted curves, got {listed!r:.40}")
    curves = tuple(curve_from_dict(c, f"{path} curve {i}") for i, c in enumerate(listed))
    if not curves:
        raise KitError(f"calibration {path} has no curves")
    seen = {}
    for i, c in enumerate(curves):  # a second curve would never be read: curve() takes the first
        first = seen.setdefault((c.kind, c.ranks, c.nodes), i)
        if first != i:
            on = f" on {c.nodes} node(s)" if c.nodes else ""
            raise KitError(f"calibration {path}: curves {first} and {i} are both for {c.kind} on "
                           f"{c.ranks} ranks{on}; keep one")
    return Calibration(system=str(d.get("system", "")), curves=curves, source=str(path))


def fit_table(table, system: str = "", source: str = "", min_points: int = 4) -> Calibration:
    """Fit one curve per (kind, ranks, nodes) of a measurement table (columns kind, ranks,
    size_bytes, time_us, and optionally nodes: the nodes the group spanned, NaN or 0 when not known)."""
    missing = {"kind", "ranks", "size_bytes", "time_us"} - set(table.columns)
    if missing:
        raise KitError(f"measurement table lacks column(s) {', '.join(sorted(missing))}")
    where = source or "the table"
    if "wrong" in table.columns and (table["wrong"] > 0).any():
        bad = table[table["wrong"] > 0]
        first = bad.iloc[0]
        raise KitError(f"{where}: the benchmark counted wrong results in {len(bad)} row(s) (first: "
                       f"{first['kind']} x{first['ranks']} at {first['size_bytes']} B, #wrong "
                       f"{first['wrong']}); a run that fails its own check is not fitted: re-run it")
    nodes = table["nodes"].fillna(0) if "nodes" in table.columns else 0
    table = table.assign(nodes=nodes)
    if not ((table["nodes"] >= 0) & (table["nodes"] <= table["ranks"]) & (table["nodes"] % 1 == 0)).all():
        raise KitError(f"{where}: nodes must be a whole number from 1 to ranks (or empty: not known)")
    curves, short = [], []
    for (kind, ranks, n_nodes), g in table.groupby(["kind", "ranks", "nodes"], sort=True):
        g = g.groupby("size_bytes", as_index=False)["time_us"].median()
        on = f" on {int(n_nodes)} node(s)" if n_nodes else ""
        if len(g) >= min_points:
            curves.append(replace(fit_curve(kind, int(ranks), g.size_bytes.values, g.time_us.values),
                                  nodes=int(n_nodes)))
        else:
            short.append(f"{kind} x{ranks} ({len(g)}){on}")
    if short:  # fitting the others alone would drop these measurements without a word
        raise KitError(f"{where}: a curve needs {min_points}+ sizes; too few for {', '.join(short)}"
                       + (f" (the others fit: {', '.join(f'{c.kind} x{c.ranks}' for c in curves)})"
                          if curves else ""))
    return Calibration(system=system, curves=tuple(curves), source=source)
