"""Where a measurement ran: the device and software versions (environment), the torch flags, an
nvidia-smi snapshot of the GPU torch times (selected by its PCI bus id), and FILE.meta.json, the
per-run record every collector keeps beside its output (Meta, run_record)."""
from __future__ import annotations

import csv
import json
import platform
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from kit.data.records import side_path
from kit.errors import KitError
from kit.whole_file import replace_file


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(device: str) -> dict:
    """device_name, gpu key and software versions of the device to measure on."""
    import torch

    versions = {"torch_version": torch.__version__,
                "cuda_version": torch.version.cuda if device == "cuda" else None,
                "cudnn_version": (str(torch.backends.cudnn.version())
                                  if device == "cuda" and torch.backends.cudnn.is_available() else None)}
    if device == "cpu":
        return {"device_name": f"cpu: {_cpu_name()}", "gpu": None, **versions}
    if not torch.cuda.is_available():
        raise KitError("--device cuda: no CUDA GPU is visible to torch here; use --device cpu")
    name = torch.cuda.get_device_name()
    from kit.hardware import get_gpu

    try:
        key = get_gpu(name).key
    except KitError:
        raise KitError(f"this GPU, {name!r}, is not in the catalog; add it with --gpu-file FILE "
                       "(the format of `kit gpus --json`) so its rows can be read back") from None
    return {"device_name": name, "gpu": key, **versions}




def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


SMI_FIELDS = ("name", "pci.bus_id", "driver_version", "pstate", "clocks.sm", "clocks.mem",
              "clocks.max.sm", "clocks.max.mem", "temperature.gpu", "power.draw", "power.limit",
              "utilization.gpu", "memory.used", "memory.total")
SMI_REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new name, old name


def nvidia_smi(index: int | str | None = None, timeout: float = 15.0) -> dict:
    """One nvidia-smi --query-gpu snapshot (clocks, power, temperature, throttle reasons) of GPU
    `index` (nvidia-smi's -i: an index, a PCI bus id or a UUID), as {field: text}; {"error": ...}
    when nvidia-smi is missing or fails. Never raises."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"error": "nvidia-smi not found"}
    last = "no query ran"
    for extra in (*[(r,) for r in SMI_REASONS], ()):  # a driver that lacks a field refuses the query
        fields = SMI_FIELDS + extra
        cmd = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        if index is not None:
            cmd += ["-i", str(index)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            return {"error": f"nvidia-smi: {e}"}
        if r.returncode == 0 and r.stdout.strip():
            values = next(csv.reader([r.stdout.strip().splitlines()[0]], skipinitialspace=True), [])
            out = dict(zip(fields, (v.strip() for v in values)))
            out["time"] = _now()
            return out
        last = (r.stderr or r.stdout).strip().splitlines()[0] if (r.stderr or r.stdout).strip() else f"rc {r.returncode}"
    return {"error": f"nvidia-smi: {last}"}


def smi_ids(index: int | None = None) -> list[str]:
    """nvidia-smi's ids of torch's CUDA device `index` (default the current one): its PCI bus id
    as nvidia-smi writes it (00000000:3B:00.0), then its UUID (GPU-...), as far as torch says.
    torch's device 0 need not be nvidia-smi's (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)."""
    import torch

    try:
        p = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    except Exception:  # noqa: BLE001 - no CUDA, an old torch
        return []
    ids = []
    if getattr(p, "pci_bus_id", None) is not None:
        ids.append(f"{int(getattr(p, 'pci_domain_id', 0) or 0):08X}:{int(p.pci_bus_id):02X}:"
                   f"{int(getattr(p, 'pci_device_id', 0) or 0):02X}.0")
    if getattr(p, "uuid", None):
        ids.append(str(p.uuid) if str(p.uuid).startswith("GPU-") else f"GPU-{p.uuid}")
    return ids


def gpu_snapshot(index: int | None = None) -> dict:
    """nvidia_smi of the GPU torch times (device `index`, default the current one), selected by
    smi_ids, with "selected_by"; "name_mismatch" says when nvidia-smi names another GPU than torch.
    Without an id from torch, nvidia-smi's first GPU, said so."""
    import torch

    snap = {"error": "no query ran"}
    for sel in smi_ids(index) or [None]:
        snap = nvidia_smi(sel)
        snap["selected_by"] = f"-i {sel}" if sel else "nothing (torch gave no PCI bus id or UUID): GPU 0"
        if "error" not in snap:
            break
    try:
        name = torch.cuda.get_device_name(index)
    except Exception:  # noqa: BLE001
        name = None
    if name and snap.get("name") and snap["name"] != name:
        snap["name_mismatch"] = f"torch times {name!r}; nvidia-smi reports {snap['name']!r}"
    return snap


def run_record(device: str) -> dict:
    """The start of every collector's run entry in FILE.meta.json: when and where it ran (host,
    python, argv), torch's flags and the nvidia-smi snapshot of the timed GPU."""
    return {"started": _now(), "finished": None, "status": "running", "host": socket.gethostname(),
            "python": sys.version.split()[0], "argv": sys.argv, "torch": torch_settings(device),
            "nvidia_smi_before": gpu_snapshot() if device == "cuda" else None}


def torch_settings(device: str) -> dict:
    """The torch flags that change what a GEMM or conv runs (read when the run starts)."""
    import torch

    out = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
           "num_threads": torch.get_num_threads()}
    if device == "cuda":
        m = torch.backends.cuda.matmul
        for name in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                     "allow_bf16_reduced_precision_reduction"):
            out[f"matmul.{name}"] = getattr(m, name, None)
        cudnn = torch.backends.cudnn
        out.update({"cudnn.allow_tf32": cudnn.allow_tf32, "cudnn.benchmark": cudnn.benchmark,
                    "cudnn.deterministic": cudnn.deterministic})
        try:
            out["cuda_driver_api"] = int(torch._C._cuda_getDriverVersion())
        except Exception:  # noqa: BLE001 - private, may be gone
            pass
    return out


def recorded_runs(csv: str | Path) -> list[dict] | None:
    """The runs FILE.meta.json records for a CSV (None: no readable meta beside it)."""
    try:
        doc = json.loads(side_path(csv, ".meta.json").read_text())
    except (OSError, ValueError):
        return None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else None


def linear_without_bias(csv: str | Path) -> bool:
    """Whether the collector's meta beside a CSV (FILE.meta.json) says its linear rows were timed
    without a bias (`kit collect --no-bias`); NeuSight's Linear rows, which the learned predictors
    learn from, have one. Unknown (no meta, an older or foreign one) counts as with. Only runs that
    timed linear and may have written rows count (as mixed_settings has them): every run records
    linear_bias, and a `--ops bmm --no-bias` run, or a --no-bias run that measured nothing, before
    a linear run with a bias had left out all of that run's linear rows. `kit train --extra`
    leaves such rows out, and `kit evaluate` too."""
    def timed_linear_without(run: dict) -> bool:
        s = run.get("settings") or {}
        ops = s.get("ops") or ("linear",)  # a meta that does not say which ops: it may have
        return s.get("linear_bias") is False and "linear" in ops and run.get("measured") != 0

    return any(timed_linear_without(r) for r in recorded_runs(csv) or ())


class Meta:
    """FILE.meta.json: {"csv", "runs": [...]}, this run's entry written at its start and updated at
    its end (atomically: a temporary file renamed over it)."""

    def __init__(self, out: str | Path, run: dict, resume: bool):
        self.path = side_path(out, ".meta.json")
        self.doc = {"csv": Path(out).name, "runs": []}
        self.found = False  # an earlier meta was read (resume)
        runs = recorded_runs(out) if resume else None
        if runs is not None:
            self.doc["runs"], self.found = runs, True
        self.doc["runs"].append(run)
        self.run = run

    def earlier(self) -> list[dict]:
        return self.doc["runs"][:-1]

    def write(self) -> None:
        try:  # its own temporary file + rename had left FILE.meta.json.tmp behind a failed write
            replace_file(self.path, json.dumps(self.doc, indent=1, default=str).encode("utf-8"))
        except OSError as e:
            raise KitError(f"cannot write {self.path}: {e.strerror or e}; choose another --out") from None


def mixed_settings(earlier: list[dict], run: dict) -> list[str]:
    """What makes rows of `run` mean something else than those of earlier runs on the same device
    that may have written rows (FILE.meta.json's): --repeats (the statistic is the fastest fifth of
    them), the L2 flush, the profiler (kernel columns), CPU threads, and linear's bias where both
    measured linear, and how many profiled calls kernel_ms is the median of (one in kits before
    the median). Warm-ups (--warmup, --warmup-ms), --cooldown-ms and --time-limit only steady or
    bound a run and may differ; the dtype is in every row's key."""
    now, out = run["settings"], set()
    for r in earlier:
        s = r.get("settings") or {}
        if r.get("measured") == 0 or s.get("device") != now["device"]:
            continue
        for key, flag in (("repeats", "--repeats"), ("l2_flush", "--no-l2-flush"), ("profile", "--no-profile")):
            if key in s and s[key] != now[key]:
                out.add(f"{flag} ({key} {s[key]} then, {now[key]} now)")
        if s.get("profile") and now.get("profile"):  # kernel_ms: one profiled call before the kit
            then = s.get("profiled_calls", 1)        # took the median of several
            if then != now.get("profiled_calls", 1):
                out.add(f"the kit's kernel_ms (the median of {now.get('profiled_calls', 1)} profiled "
                        f"calls now, {then} then: resume with the kit that measured them)")
        threads = (r.get("torch") or {}).get("num_threads"), run["torch"]["num_threads"]
        if now["device"] == "cpu" and threads[0] not in (None, threads[1]):
            out.add(f"--threads ({threads[0]} then, {threads[1]} now)")
        if "linear" in s.get("ops", ()) and "linear" in now["ops"] and \
                s.get("linear_bias", True) != now["linear_bias"]:
            out.add(f"--no-bias (linear rows measured {'with' if s.get('linear_bias', True) else 'without'} "
                    "a bias then)")
    return sorted(out)
