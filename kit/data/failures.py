"""The collector's failed measurements, beside its CSV: FILE.failed.jsonl (one line per failure)
and FILE.measuring.json (the measurement in progress, so that a run that dies without a word,
killed with SIGKILL or crashed in a library, is known by the next one).

A resumed run measures a failed shape again, unless it cannot get past it: a failure that lost
the CUDA context (`fatal`: the run stopped there, and a resume would stop at it first again), or
a shape the process died measuring twice (`died`). Those are skipped and listed;
`--retry-failed` measures them again. A failure that did not stop the run (out of memory, a
shape cuBLAS refused) is measured again, as before.
"""
from __future__ import annotations

import json
from pathlib import Path

from kit.data.op_calls import shape_columns
from kit.data.provenance import _now, side_path
from kit.data.records import append_jsonl, read_jsonl, row_key
from kit.data.timing import is_fatal_cuda_error

DIED = ("the process died while measuring it (killed, or crashed without a Python error); "
        "see the run's log")
DEATHS_TO_SKIP = 2  # one death may be a kill by hand (timeout -s KILL): measured once more


def shape_key(op: str, shape, dtype: str, device_name) -> tuple:
    """The row key (kit.data.records.row_key) of op on a NeuSight-order shape."""
    return row_key({"op": op, **shape_columns(op, tuple(shape)), "dtype": dtype,
                    "device_name": device_name})


def _fatal(record: dict) -> bool:
    """Whether a failure stopped its run: the flag, or for a line written before the flag, its
    error read as is_fatal_cuda_error reads an exception's text."""
    if "fatal" in record:
        return record["fatal"] is True
    return is_fatal_cuda_error(RuntimeError(str(record.get("error", ""))))


class Failures:
    """FILE.failed.jsonl and FILE.measuring.json of one run of the collector."""

    def __init__(self, out: str | Path, dtype: str, device_name):
        self.path = side_path(out, ".failed.jsonl")
        self.marker = side_path(out, ".measuring.json")
        self.dtype, self.device_name = dtype, device_name
        self.new: list[dict] = []  # this run's

    def record(self, op: str, shape, error: str, fatal: bool = False) -> None:
        """Append one failure of this run (fatal: it lost the CUDA context and stopped the run)."""
        item = {"op": op, "shape": list(shape), "error": error, "fatal": fatal}
        self.new.append(item)
        self._log(self.dtype, self.device_name, item)

    def _log(self, dtype: str, device, item: dict) -> None:
        """One line of FILE.failed.jsonl (never raises: a full disk must not hide the error)."""
        try:
            append_jsonl(self.path, {"time": _now(), "dtype": dtype, "device": device, **item})
        except OSError:
            pass

    def earlier_death(self) -> dict | None:
        """The measurement an earlier run left in progress (it died without ending): recorded as
        a failure (`died`), the marker removed; None when the last run ended."""
        try:
            text = self.marker.read_text(encoding="utf-8")
        except OSError:
            return None
        try:
            was = json.loads(text)
            op, shape = was["op"], was["shape"]
            dtype, device = was["dtype"], was["device"]
            if not (isinstance(op, str) and isinstance(shape, list)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in shape)):
                raise TypeError("not a marker measuring() writes")
        except (ValueError, KeyError, TypeError):  # cut short as it was written, or edited: nothing to say
            self.ended()
            return None
        item = {"op": op, "shape": list(shape), "error": DIED, "died": True,
                "phase": was.get("phase", "measuring"), "since": was.get("time")}
        self._log(dtype, device, item)
        self.ended()
        return item

    def blocked(self) -> dict[tuple, dict]:
        """Shapes a resume cannot get past, by row key: their latest failure that stopped a run,
        or the latest death of a shape the process died measuring DEATHS_TO_SKIP times."""
        out, deaths = {}, {}
        for r in read_jsonl(self.path):
            if r.get("dtype") != self.dtype or r.get("device") != self.device_name:
                continue
            try:
                key = shape_key(r["op"], r["shape"], self.dtype, self.device_name)
            except (KeyError, TypeError, ValueError):
                continue
            if r.get("died") is True:
                deaths[key] = deaths.get(key, 0) + 1
                if deaths[key] >= DEATHS_TO_SKIP:
                    out[key] = {**r, "error": f"{DIED} ({deaths[key]} times)"}
            elif _fatal(r):
                out[key] = r
        return out

    def measuring(self, op: str, shape, phase: str = "measuring") -> None:
        """Say which shape is about to run (a plain write: a process that dies leaves the page
        cache to the kernel, so no fsync is needed to be read by the next run)."""
        try:
            self.marker.write_text(json.dumps({"op": op, "shape": list(shape), "dtype": self.dtype,
                                               "device": self.device_name, "phase": phase,
                                               "time": _now()}), encoding="utf-8")
        except OSError:
            pass

    def ended(self) -> None:
        """The run ended (done, stopped, or a Python exception): nothing is in progress (never
        raises, as measuring: a side file that cannot be removed must not stop the run)."""
        try:
            self.marker.unlink(missing_ok=True)
        except OSError:
            pass
