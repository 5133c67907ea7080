"""Named host profiles: fitted HostModel constants for a software stack on a system.

profiles.json beside this module holds each profile with what it was fitted on and the script
that reproduces it (benchmarks/vtrain_megatron.py --fit for "megatron-a100").
"""
from __future__ import annotations

import json
from pathlib import Path

from kit.errors import KitError
from kit.parallel.build import HostModel

PROFILES_PATH = Path(__file__).with_name("profiles.json")
_FIELDS = ("launch_us", "collective_us", "p2p_sync", "step_overhead_ms", "gemm_scale", "other_scale",
           "microbatch_ms", "collective_rank_us", "full_vocab_scale", "tp_comm_scale",
           "predictor", "kernels")


def profiles() -> dict:
    return json.loads(PROFILES_PATH.read_text()) if PROFILES_PATH.exists() else {}


def get_profile(name: str | None) -> HostModel:
    """A HostModel by profile name ("default" or None: the unfitted defaults)."""
    if name in (None, "default"):
        return HostModel()
    doc = profiles()
    if name not in doc:
        raise KitError(f"unknown host profile {name!r}: choose one of default, {', '.join(doc)}")
    return HostModel(**{k: doc[name][k] for k in _FIELDS if k in doc[name]})
