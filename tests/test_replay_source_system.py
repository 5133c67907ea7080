"""kit replay --on SYSTEM --from SYSTEM: the system a trace was recorded on. The measured
collectives and peer copies are rescaled from it, and a trace names no system, only its GPU and
ranks: by default the first single-node preset of that GPU with enough GPUs is taken, so a 4-rank
A100 job reads as a100x4-nvlink (NVLink 3 with 4 links a GPU pair, 4 x 25 GB/s a direction; its
preset's fabric efficiency aside) even where it ran on a DGX A100 (NVSwitch: each GPU's 12 NVLink
3 links, 300 GB/s a direction; NVIDIA A100 Tensor Core GPU Architecture whitepaper, "NVLink" and
"DGX A100"). --from names it; the default says which it took and which others fit."""
import json

import pytest

from kit.cli import main
from kit.comm import predict_collective
from kit.comm.topology import p2p_gbs
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.trace import replay
from tests.test_replay_coalesced_p2p import MEASURED_US, NELEMS, WORLD, pipeline_exchange
from kit.trace.transfer import KERNEL_FLOOR_MS
from tests.test_replay_peer_copies import ev
from tests.test_replay_process_groups import A100


def _kernel_us(r):
    g = r.tg.graph
    return [1e3 * g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops]


def test_the_named_source_prices_the_collectives(tmp_path):
    # the 4 A100 ranks exchange 4 MiB in pairs (0-1, 2-3): as one transfer between each pair
    job = pipeline_exchange(tmp_path)
    nbytes = NELEMS * 4

    def pair_ms(system):
        return predict_collective("sendrecv", nbytes, system, ranks=[0, 1]).time_ms
    default, named = replay(job, on="dgx-h100"), replay(job, on="dgx-h100", source="dgx-a100")
    assert _kernel_us(default) == [pytest.approx(MEASURED_US * pair_ms("dgx-h100") / pair_ms("a100x4-nvlink"))] * WORLD
    assert _kernel_us(named) == [pytest.approx(MEASURED_US * pair_ms("dgx-h100") / pair_ms("dgx-a100"))] * WORLD
    # the two sources' pair links: 4 NVLinks against the NVSwitch's 12, so a 4 MiB exchange that
    # took 300 us on the DGX A100 ran on a faster fabric than a100x4-nvlink's
    a4, dgx = get_system("a100x4-nvlink"), get_system("dgx-a100")
    assert p2p_gbs(dgx, 0, 1) / p2p_gbs(a4, 0, 1) == pytest.approx(12 / 4)
    assert _kernel_us(named)[0] > 1.2 * _kernel_us(default)[0]


def test_the_default_source_is_said_with_the_others_that_fit(tmp_path):
    job = pipeline_exchange(tmp_path)
    r = replay(job, on="dgx-h100").to_dict()
    assert r["source_system"] == [{"system": "a100x4-nvlink", "ranks": [0, 1, 2, 3], "chosen": (
        "the first single-node preset with 4 x a100-sxm4-40gb (not read from the trace; also "
        "dgx-a100: name the one it ran on with --from/source=)")}]
    assert any(n.startswith("source system a100x4-nvlink (ranks 0-3): the first single-node preset")
               for n in r["notes"]), r["notes"]
    named = replay(job, on="dgx-h100", source="dgx-a100").to_dict()
    assert named["source_system"] == [{"system": "dgx-a100", "ranks": [0, 1, 2, 3], "chosen": "named with --from/source="}]
    assert replay(job).to_dict()["source_system"] is None
    assert replay(job, on="h100-sxm").to_dict()["source_system"] is None  # a GPU target uses none


def test_the_named_source_prices_peer_copies(tmp_path):
    # an A100's 1 ms copy of 64 MiB from GPU 0 to GPU 1, replayed on a DGX H100 (NVSwitch, 18 NVLink
    # 4 links a GPU, 450 GB/s a direction): from a100x4-nvlink's 4 links (100 GB/s) by default, from a
    # DGX A100's NVSwitch (12 links, 300 GB/s) when named. The presets' NVLink efficiency (0.975 on
    # both) cancels; the first 2 us are the floor (above_floor_ms)
    doc = {"deviceProperties": [{"name": A100}], "traceEvents": [
        ev("ProfilerStep#1", 0, 1100, "cpu_op"),
        ev("cudaMemcpyAsync", 10, 5, "cuda_runtime", correlation=9),
        ev("Memcpy PtoP (Device -> Device)", 20, 1000, "gpu_memcpy", tid=7, correlation=9, stream=7,
           bytes=64 << 20, fromDevice=0, toDevice=1),
        ev("cudaStreamSynchronize", 16, 1010, "cuda_runtime", correlation=10)]}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))

    def floored_us(ratio):
        return 1e3 * (KERNEL_FLOOR_MS + (1.0 - KERNEL_FLOOR_MS) * ratio)
    assert _kernel_us(replay(p, on="dgx-h100")) == [pytest.approx(floored_us(100 / 450))]
    named = replay(p, on="dgx-h100", source="dgx-a100")
    assert _kernel_us(named) == [pytest.approx(floored_us(300 / 450))]
    assert any("scaled by the GPU-to-GPU link of dgx-a100 to dgx-h100" in n for n in named.to_dict()["notes"])


@pytest.mark.parametrize("source,on,msg", [
    ("dgx-z100", "dgx-h100", "--from/source= 'dgx-z100': unknown system"),
    ("dgx-h100", "dgx-h100", "--from/source= 'dgx-h100': dgx-h100 has 8 x h100-sxm, but the trace ran 4 "
                             "rank(s) on a100-sxm4-40gb; name a preset system with at least 4 x "
                             "a100-sxm4-40gb (a100x4-nvlink, dgx-a100, dgx-a100-ib-hdr-x4)"),
    ("a100x4-nvlink-x1", "h100-sxm", "--from/source= 'a100x4-nvlink-x1' goes with a system as --on/on="),
    ("dgx-a100", None, "--from/source= 'dgx-a100' goes with --on/on= SYSTEM"),
])
def test_a_bad_source_is_one_clear_error(tmp_path, source, on, msg):
    with pytest.raises(KitError) as e:
        replay(pipeline_exchange(tmp_path), on=on, source=source)
    assert str(e.value).startswith(msg), str(e.value)


def test_a_source_with_too_few_gpus_is_refused(tmp_path):
    # an 8-rank job cannot have run on a100x4-nvlink's 4 GPUs
    from tests.test_replay_process_groups import job

    def fields(r):
        return {"Collective name": "allreduce", "Process Group Ranks": str(list(range(8))), "Group size": 8,
                "In msg nelems": 1 << 20, "dtype": "Float"}
    p = job(tmp_path, A100, fields, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)")
    with pytest.raises(KitError, match=r"--from/source= 'a100x4-nvlink': a100x4-nvlink has 4 x a100-sxm4-40gb, "
                                       r"but the trace ran 8 rank\(s\)"):
        replay(p, on="dgx-h100", source="a100x4-nvlink")


def test_the_cli_takes_from_and_says_the_source(tmp_path, capsys):
    job = str(pipeline_exchange(tmp_path))
    assert main(["replay", job, "--on", "dgx-h100", "--from", "dgx-a100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source_system"][0]["system"] == "dgx-a100"
    assert main(["replay", job, "--on", "dgx-h100"]) == 0
    text = capsys.readouterr().out
    assert "note: source system a100x4-nvlink (ranks 0-3): the first single-node preset" in text, text
    rc = main(["replay", job, "--on", "dgx-h100", "--from", "nope"])
    err = capsys.readouterr().err
    assert rc != 0 and "--from/source= 'nope': unknown system" in err and "Traceback" not in err, err


def test_the_api_takes_the_source_as_the_cli_does(tmp_path):
    from kit.api import replay_trace

    job = pipeline_exchange(tmp_path)
    d = replay_trace(job, on="dgx-h100", source="dgx-a100")
    assert d["source_system"] == [{"system": "dgx-a100", "ranks": [0, 1, 2, 3], "chosen": "named with --from/source="}]
    assert d["ranks"] == replay(job, on="dgx-h100", source="dgx-a100").to_dict()["ranks"]
    with pytest.raises(KitError, match="--from/source= 'dgx-z100': unknown system"):
        replay_trace(job, on="dgx-h100", source="dgx-z100")


def _peer_copy(tmp_path, dur_us, nbytes=64 << 20):
    doc = {"deviceProperties": [{"name": A100}], "traceEvents": [
        ev("ProfilerStep#1", 0, dur_us + 100, "cpu_op"),
        ev("cudaMemcpyAsync", 10, 5, "cuda_runtime", correlation=9),
        ev("Memcpy PtoP (Device -> Device)", 20, dur_us, "gpu_memcpy", tid=7, correlation=9, stream=7,
           bytes=nbytes, fromDevice=0, toDevice=1),
        ev("cudaStreamSynchronize", 16, dur_us + 10, "cuda_runtime", correlation=10)]}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_peer_copy_faster_than_the_source_link_is_said_and_held_to_the_target_link(tmp_path):
    # 64 MiB from GPU 0 to 1 in 300 us is 223.7 GB/s: more than a100x4-nvlink's 4 NVLinks a pair
    # carry at their line rate (4 x 25 GB/s), so the trace did not run there (a DGX A100's
    # NVSwitch, 300 GB/s, does carry it). Scaled by the default source's link (97.5 / 438.75, the
    # presets' one efficiency) it had taken 0.068 ms on a DGX H100, 984 GB/s over a pair link of
    # 450 GB/s (18 x 25): now no less than the bytes over that link at its line rate, and the note
    # says the source cannot be the one taken
    nbytes = 64 << 20
    p = _peer_copy(tmp_path, 300, nbytes)
    h100_line, a100x4_line = 18 * 25, 4 * 25
    assert nbytes / 300e-6 / 1e9 > a100x4_line
    r = replay(p, on="dgx-h100")
    assert _kernel_us(r) == [pytest.approx(1e6 * nbytes / (h100_line * 1e9))]
    assert any(n.startswith("1 peer-to-peer (PtoP) copy ran faster than a100x4-nvlink's link between their "
                            "GPUs carries (up to 223.7 GB/s over 100.00)") for n in r.to_dict()["notes"])
    # from the DGX A100 it fits its link (223.7 of 292.5 GB/s): scaled by the links, no note
    h100 = p2p_gbs(get_system("dgx-h100"), 0, 1)
    named = replay(p, on="dgx-h100", source="dgx-a100")
    ratio = p2p_gbs(get_system("dgx-a100"), 0, 1) / h100
    assert _kernel_us(named) == [pytest.approx(1e3 * (KERNEL_FLOOR_MS + (0.3 - KERNEL_FLOOR_MS) * ratio))]
    assert not any("ran faster" in n for n in named.to_dict()["notes"])


def test_a_gpu_no_preset_has_says_so_and_how_to_go_on(tmp_path):
    # an RTX 4090 trace with --from a preset: no preset system has an RTX 4090 (`kit systems`).
    # It had said "name a system of that GPU with at least 1 GPUs (no preset has them)"
    from kit.hardware.system import list_systems

    assert not any(get_system(n).gpu_key == "rtx-4090" for n in list_systems())
    doc = {"deviceProperties": [{"name": "NVIDIA GeForce RTX 4090"}], "traceEvents": [
        ev("ProfilerStep#1", 0, 200, "cpu_op"), ev("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=9),
        ev("elementwise_kernel", 20, 100, "kernel", tid=7, correlation=9, stream=7)]}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(KitError) as e:
        replay(p, on="dgx-h100", source="dgx-h100")
    msg = str(e.value)
    assert msg.startswith("--from/source= 'dgx-h100': dgx-h100 has 8 x h100-sxm, but the trace ran 1 rank(s) "
                          "on rtx-4090; no preset system has 1 or more x rtx-4090"), msg
    assert "replay with a GPU as --on/on= instead" in msg and "no preset has them" not in msg, msg
    assert replay(p, on="h100-sxm").to_dict()["on"] == "h100-sxm"  # the way on it names works


def test_api_errors_name_the_api_arguments_too(tmp_path):
    # kit.api.replay_trace takes on= and source=: its messages had named only --on and --from
    from kit.api import replay_trace

    job = pipeline_exchange(tmp_path)
    with pytest.raises(KitError, match=r"^--from/source= 'dgx-a100' goes with --on/on= SYSTEM"):
        replay_trace(job, source="dgx-a100")
    with pytest.raises(KitError, match=r"^--on/on= 'nope': not a GPU"):
        replay_trace(job, on="nope")
    with pytest.raises(KitError, match=r"^--on/on= 'dgx-h100x0'"):
        replay_trace(job, on="dgx-h100x0")


def test_a_peer_copy_replayed_on_its_own_system_keeps_its_measured_time(tmp_path):
    # 64 MiB from GPU 0 to 1 in 678 us is 99.0 GB/s: under a100x4-nvlink's 4 NVLinks a pair at
    # their line rate (4 x 25 = 100 GB/s), so it can have run there. At the preset's achieved rate
    # (0.975 of it, 97.5 GB/s: 0.688 ms) it had been clamped up from 0.678 ms replayed --on the
    # system it ran on, and said to have run faster than that system's link
    nbytes = 64 << 20
    assert nbytes / 678e-6 / 1e9 == pytest.approx(99.0, abs=0.05) and nbytes / (4 * 25e9) < 678e-6
    r = replay(_peer_copy(tmp_path, 678, nbytes), on="a100x4-nvlink", source="a100x4-nvlink")
    assert _kernel_us(r) == [pytest.approx(678)]
    assert not any("ran faster" in n for n in r.to_dict()["notes"]), r.to_dict()["notes"]


def test_a_named_source_a_peer_copy_beats_is_said_without_asking_for_from(tmp_path):
    # 223.7 GB/s over a100x4-nvlink's 100 with --from a100x4-nvlink given: the note had said
    # "name its system with --from"
    notes = replay(_peer_copy(tmp_path, 300), on="dgx-h100", source="a100x4-nvlink").to_dict()["notes"]
    said = [n for n in notes if "ran faster than a100x4-nvlink's link" in n]
    assert len(said) == 1 and "name its system with" not in said[0], notes
    assert ("the trace was not recorded there, though --from/source= 'a100x4-nvlink' names it; name "
            "the system it ran on" in said[0]), said
