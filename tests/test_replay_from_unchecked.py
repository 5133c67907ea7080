"""--from with nothing to check it against: a trace whose ranks ran no GPU work (CPU-only) or
name no GPU. pick_source_system checks --from against each rank's GPU, and transfer skipped the
ranks without one, so a misspelt or too small --from went by in silence (no error, no note,
source_system []). Now the system is looked up and its size checked first, and a note says it
was not checked against the trace nor used."""
import json

import pytest

from kit.cli import main
from kit.errors import KitError
from kit.trace import replay
from tests.test_replay_peer_copies import ev


def _cpu_only(tmp_path, world=None):
    doc = {"traceEvents": [ev("ProfilerStep#1", 0, 200, "cpu_op"), ev("aten::add", 10, 50, "cpu_op")]}
    if world is not None:
        doc["distributedInfo"] = {"rank": 0, "world_size": world}
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps(doc))
    return p


def test_an_unknown_from_is_an_error_on_a_cpu_only_trace(tmp_path):
    with pytest.raises(KitError, match=r"^--from/source= 'dgx-z100': unknown system"):
        replay(_cpu_only(tmp_path), on="dgx-h100", source="dgx-z100")


def test_a_from_too_small_for_the_job_is_an_error_on_a_cpu_only_trace(tmp_path):
    # a 16-rank job (distributedInfo) cannot have run on dgx1-v100's 8 GPUs; dgx-h100-ib-ndr-x4
    # (32 GPUs) as --on holds it
    with pytest.raises(KitError, match=r"^--from/source= 'dgx1-v100': dgx1-v100 has 8 x v100-sxm2-32gb, "
                                       r"but the trace ran 16 rank\(s\)"):
        replay(_cpu_only(tmp_path, world=16), on="dgx-h100-ib-ndr-x4", source="dgx1-v100")


def test_a_from_with_no_gpu_work_to_check_is_said(tmp_path, capsys):
    p = _cpu_only(tmp_path)
    d = replay(p, on="dgx-h100", source="dgx1-v100").to_dict()
    assert d["source_system"] == []
    assert any(n.startswith("--from/source= 'dgx1-v100' (dgx1-v100, 8 x v100-sxm2-32gb) is not checked "
                            "against the trace's GPU nor used") for n in d["notes"]), d["notes"]
    assert main(["replay", str(p), "--on", "dgx-h100", "--from", "nope"]) != 0
    err = capsys.readouterr().err
    assert "--from/source= 'nope': unknown system" in err and "Traceback" not in err, err


def test_a_from_of_another_gpu_and_too_small_names_the_traces_gpu(tmp_path):
    # 8 V100 ranks, --from a100x4-nvlink (4 A100s): wrong on both counts. Checked for its size
    # before the rank's GPU, the error had said only "at least 8 GPUs", not which GPU nor the
    # preset that has 8 of them (dgx1-v100: 8 x Tesla V100-SXM2-32GB)
    from tests.test_replay_process_groups import V100, job, pairs_of_two

    d = job(tmp_path, V100, pairs_of_two(1 << 20), "ncclKernel_AllReduce_RING_LL_Sum_float")
    with pytest.raises(KitError, match=r"^--from/source= 'a100x4-nvlink': a100x4-nvlink has 4 x a100-sxm4-40gb, "
                                       r"but the trace ran 8 rank\(s\) on v100-sxm2-32gb; name a preset system "
                                       r"with at least 8 x v100-sxm2-32gb \(dgx1-v100\)$"):
        replay(d, on="dgx-h100", source="a100x4-nvlink")
