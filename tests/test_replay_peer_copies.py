"""kit replay --on: a peer-to-peer copy ("Memcpy PtoP (Device -> Device)") scales by the link
between its two GPUs on the source's preset node and on the target system, not by HBM.

Expected rates are typed from the datasheets, not read from kit.comm: NVLink 2.0 and 4.0 carry
25 GB/s per direction a link (Tesla V100 whitepaper; H100 whitepaper: 18 links, 900 GB/s both
ways); a DGX-1's GPUs 0 and 3 have 2 links between them, 0 and 1 one (DGX-1 with Tesla V100
System Architecture whitepaper, its hybrid cube-mesh figure); a DGX H100's NVSwitch gives each
GPU all 18. The presets' one fabric efficiency (0.975 for NVLink 2 and 4) cancels in the ratio."""
import json

import pytest

from kit.trace import replay
from kit.trace.transfer import KERNEL_FLOOR_MS
from tests.test_replay_audit import ev

V100 = "Tesla V100-SXM2-32GB"
PTOP = "Memcpy PtoP (Device -> Device)"  # torch 2.13's Kineto: "Memcpy {} ({} -> {})"


def _copy_ms(tmp_path, on, name=PTOP, nbytes=64 << 20, **args):
    """A 1 ms copy of nbytes (a peer copy by default), the step's only GPU work, recorded on a
    V100 and replayed on `on`: (ms, notes)."""
    doc = {"deviceProperties": [{"name": V100}], "traceEvents": [
        ev("ProfilerStep#1", 0, 1100, "cpu_op"),
        ev("cudaMemcpyAsync", 10, 5, "cuda_runtime", correlation=9),
        ev(name, 20, 1000, "gpu_memcpy", tid=7, correlation=9, stream=7, bytes=nbytes,
           inDevice=args.get("fromDevice", 0), **args),
        ev("cudaStreamSynchronize", 16, 1010, "cuda_runtime", correlation=10)]}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    r = replay(p, on=on)
    (op,) = [op for op, *_ in r.tg.gpu_ops[0]]
    return r.tg.graph.dur_ms[op], r.to_dict()["notes"]


def _floored(ratio):
    return KERNEL_FLOOR_MS + (1.0 - KERNEL_FLOOR_MS) * ratio


@pytest.mark.parametrize("pair,links", [((0, 3), 2), ((0, 1), 1)])
def test_a_peer_copy_scales_by_its_pairs_nvlinks(tmp_path, pair, links):
    # by HBM it had gone to 0.270 ms on a DGX H100 (900 vs 3352 GB/s), whatever its pair. 16 MiB
    # in 1 ms (16.8 GB/s) fits one NVLink 2 (25 GB/s); 64 MiB (67.1) fits neither pair's links
    # and is held to the target's (test_replay_source_system)
    ms, notes = _copy_ms(tmp_path, "dgx-h100", nbytes=16 << 20, fromDevice=pair[0], toDevice=pair[1])
    assert ms == pytest.approx(_floored(links * 25 / (18 * 25)), rel=1e-6)
    assert any("1 peer-to-peer (PtoP) copy scaled by the GPU-to-GPU link of dgx1-v100 to dgx-h100 "
               "(each copy's own pair" in n for n in notes), notes


def test_a_peer_copy_without_its_pair_takes_the_nodes_mean(tmp_path):
    ms, notes = _copy_ms(tmp_path, "dgx-h100")
    ms_far, _ = _copy_ms(tmp_path, "dgx-h100", fromDevice=0, toDevice=9)  # past the node's 8 GPUs
    # a DGX-1's 28 pairs: 8 with 2 NVLinks, 8 with 1, 12 with none (the PCIe tree, slower than one
    # NVLink): the mean is under 1.5 links, over 16/28 of one
    lo, hi = _floored((8 * 2 + 8) / 28 * 25 / 450), _floored(1.5 * 25 / 450)
    assert lo < ms < hi and ms_far == ms
    assert any("the mean over each node's GPU pairs" in n for n in notes), notes


def test_a_peer_copy_on_a_gpu_target_keeps_its_time_and_says_why(tmp_path):
    # a GPU has no fabric to scale it by (as the collectives): it had been scaled by HBM, 0.27 ms
    ms, notes = _copy_ms(tmp_path, "h100-sxm", fromDevice=0, toDevice=3)
    assert ms == pytest.approx(1.0)
    assert any("1 peer-to-peer (PtoP) copy keep their measured times: --on/on= names a GPU" in n
               for n in notes), notes


def test_a_device_copy_still_scales_by_hbm(tmp_path):
    # a DtoD copy stays on one GPU: HBM, 900 vs 3352 GB/s (V100 SXM2 and H100 SXM datasheets)
    ms, _ = _copy_ms(tmp_path, "dgx-h100", name="Memcpy DtoD (Device -> Device)")
    assert ms == pytest.approx(_floored(900 / 3352), rel=1e-6)
