"""kit replay --on SYSTEM: a collective's measured time is scaled by kit.comm's time for it on the
target over the source, and held to no less than its bandwidth bound on the target: its bytes x
the algorithm's factor over the links' line rate, without the latency terms, the links'
efficiency or the HBM bytes kit.comm charges beside the wire (a physical bound: a trace replayed
on the system it ran on keeps its measured times). A measured time under the source preset's
own bound says the trace was not recorded there (a note points to --from / source=). Before,
nothing bounded it: an 8-rank all-reduce of 64 MiB measured in 200 us on V100s (the default
source dgx1-v100's links carry its bytes in 0.783 ms at the least) went to 54 us on a DGX H100,
under the 168 us its NVSwitch needs.

The bounds below are hand arithmetic from the datasheets' link rates, per direction: a V100's six
NVLink 2 links of 25 GB/s (150 GB/s; Tesla V100 whitepaper WP-08608-001), a DGX-1 pair with two
of them 50 GB/s; an H100 SXM's 18 NVLink 4 links of 25 GB/s (450 GB/s), an A100's 12 NVLink 3
(300 GB/s; their architecture whitepapers); a ConnectX-7 NDR NIC 50 GB/s, HDR 25 GB/s, 400 GbE
50 GB/s, one a GPU (8 a node). Bytes a byte (nccl-tests' conventions, PERFORMANCE.md): a ring
all-reduce 2(n-1)/n, a ring reduce-scatter or all-gather (n-1)/n, an NVLS all-reduce (1 + 1/n)
(each GPU sends its buffer to the switch and gets its reduced shard back once, then the
multicast: kit.comm.algorithms.nvls_wire), a send 1."""
import pytest

from kit.comm import predict_collective
from kit.trace import replay
from tests.test_replay_process_groups import MEASURED_US, V100, comm_us, job

FULL = "[" + ", ".join(map(str, range(8))) + "]"


def _allreduce(nelems):
    def fields(r):
        return {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": nelems,
                "Out msg nelems": nelems, "Group size": 8, "Process Group Name": "0",
                "Process Group Ranks": FULL}
    return fields


MIB = 1 << 20
# (kind, ranks, system) -> the line-rate time of one byte (ms), by hand (the module doc)
LINE_MS_PER_BYTE = {
    ("allreduce", 8, "dgx1-v100"): 2 * 7 / 8 / 150e9 * 1e3,  # ring over all six NVLinks
    ("allreduce", 8, "dgx-h100"): (1 + 1 / 8) / 450e9 * 1e3,  # NVLS, under the ring's 1.75
    ("sendrecv", 2, "dgx1-v100"): 1 / 50e9 * 1e3,  # pairs r, r + 4: two NVLinks (hybrid cube mesh)
    ("sendrecv", 2, "dgx-h100"): 1 / 450e9 * 1e3,
}


def _bound_ms(kind, nbytes, system, ranks):
    return nbytes * LINE_MS_PER_BYTE[(kind, len(ranks), system)]


def test_an_allreduce_faster_than_the_source_allows_is_said_and_held_to_the_target_bound(tmp_path):
    nbytes = 16 << 22  # 64 MiB of Float
    ranks = list(range(8))
    src, dst = _bound_ms("allreduce", nbytes, "dgx1-v100", ranks), _bound_ms("allreduce", nbytes, "dgx-h100", ranks)
    assert src == pytest.approx(0.7829, abs=1e-4) and dst == pytest.approx(0.1678, abs=1e-4)
    assert MEASURED_US / 1e3 < src  # 200 us: the DGX-1's links cannot carry it (0.783 ms)
    scaled = MEASURED_US * (predict_collective("allreduce", nbytes, "dgx-h100", ranks=ranks).time_ms /
                            predict_collective("allreduce", nbytes, "dgx1-v100", ranks=ranks).time_ms)
    assert scaled < 1e3 * dst  # the ratio alone: 54 us, under the DGX H100's 168 us
    durs, notes = comm_us(job(tmp_path, V100, _allreduce(16 << 20), "ncclKernel_AllReduce_RING_LL_Sum_float"),
                          on="dgx-h100")
    assert durs == pytest.approx({r: 1e3 * dst for r in range(8)}, rel=1e-9)
    said = [n for n in notes if "collective(s) ran faster than dgx1-v100's links" in n]
    assert len(said) == 1 and said[0].startswith("8 collective(s)") and "--from" in said[0], notes
    assert f"up to {src / (MEASURED_US / 1e3):,.2f}x under it" in said[0], said


def test_a_collective_within_the_source_bound_keeps_the_ratio(tmp_path):
    nbytes = 4 << 20  # 1 Mi floats: 4 MiB, 0.049 ms of bytes on the DGX-1, measured 0.2
    ranks = list(range(8))
    assert MEASURED_US / 1e3 > _bound_ms("allreduce", nbytes, "dgx1-v100", ranks)
    durs, notes = comm_us(job(tmp_path, V100, _allreduce(1 << 20), "ncclKernel_AllReduce_RING_LL_Sum_float"),
                          on="dgx-h100")
    want = MEASURED_US * (predict_collective("allreduce", nbytes, "dgx-h100", ranks=ranks).time_ms /
                          predict_collective("allreduce", nbytes, "dgx1-v100", ranks=ranks).time_ms)
    assert durs == pytest.approx({r: want for r in range(8)}, rel=1e-9)
    assert not any("ran faster" in n for n in notes), notes


def test_a_send_faster_than_the_source_link_is_held_to_the_target_pair(tmp_path):
    # ranks 0-3 send 64 MiB to 4-7 in 200 us: 336 GB/s, over a DGX-1 pair's PCIe or NVLink
    n = 16 << 20

    def fields(r):
        send = r < 4
        f = {"Collective name": "send" if send else "recv", "dtype": "Float", "In msg nelems": n,
             "Out msg nelems": n, "Group size": 8, "Process Group Name": "0", "Process Group Ranks": FULL}
        f["Dst Rank" if send else "Src Rank"] = r + 4 if send else r - 4
        return f
    durs, notes = comm_us(job(tmp_path, V100, fields, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "nccl:send"),
                          on="dgx-h100")
    want = {}
    for r in range(8):
        pair = [r % 4, r % 4 + 4]
        assert MEASURED_US / 1e3 < _bound_ms("sendrecv", 4 * n, "dgx1-v100", pair)
        want[r] = 1e3 * _bound_ms("sendrecv", 4 * n, "dgx-h100", pair)
    assert durs == pytest.approx(want, rel=1e-9)
    assert any(x.startswith("8 collective(s) ran faster than dgx1-v100's links") for x in notes), notes


def test_a_gpu_target_keeps_the_measured_collectives(tmp_path):
    r = replay(job(tmp_path, V100, _allreduce(16 << 20), "ncclKernel_AllReduce_RING_LL_Sum_float"), on="h100-sxm")
    g = r.tg.graph
    assert [1e3 * g.dur_ms[op] for ops in r.tg.gpu_ops.values() for op, *_ in ops
            if g.kind[op] == "comm"] == [pytest.approx(MEASURED_US)] * 8


@pytest.mark.parametrize("kind, nbytes, system, ranks, line_ms", [
    # hier-ring picked, 1.46x the ring's bytes; the ring: 31/32 a byte over the node's 8 NDR NICs
    # (400 GB/s, under the NVSwitch's 450)
    ("allgather", 16 * MIB, "dgx-h100-ib-ndr-x4", 32, 16 * MIB * 31 / 32 / 400e9 * 1e3),
    # hier-ring, 1.29x; the ring over 8 HDR NICs (200 GB/s, under NVLink 3's 300)
    ("reducescatter", 4 * MIB, "dgx-a100-ib-hdr-x4", 32, 4 * MIB * 31 / 32 / 200e9 * 1e3),
    # tree, 1.06x; the ring, 2 x 15/16 a byte over 8 x 400 GbE (400 GB/s)
    ("allreduce", 64 * MIB, "dgx-h100-roce-400g-x2", 16, 64 * MIB * 2 * 15 / 16 / 400e9 * 1e3),
])
def test_the_bound_is_the_least_bytes_of_any_algorithm_not_the_picked_ones(kind, nbytes, system, ranks,
                                                                          line_ms):
    # across nodes kit.comm picks a tree or hier-ring for its shorter latency, though it moves
    # more bytes a byte than the ring: the ring can carry them in less, so the picked plan's
    # bytes are no lower bound (they had floored the replay and said "not recorded there")
    from kit.comm.algorithms import plans
    from kit.comm.topology import resolve_group
    from kit.hardware.system import get_system
    from kit.trace.transfer import collective_ms

    s = get_system(system)
    r = predict_collective(kind, nbytes, s, ranks=ranks)
    ring = next(p for p in plans(s, kind, resolve_group(s, ranks)) if p.algorithm == "ring")
    assert r.algorithm != "ring" and nbytes * ring.us_per_byte / 1e3 < r.bandwidth_ms
    time_ms, bound_ms = collective_ms(kind, nbytes, s, ranks)
    assert time_ms == r.time_ms
    assert bound_ms == pytest.approx(line_ms, rel=1e-9)


def test_a_collective_replayed_on_its_own_system_keeps_its_measured_time(tmp_path):
    # 15 MiB all-reduced by 8 V100s in 200 us: 0.184 ms at the DGX-1's line rate (1.75 bytes a
    # byte over 150 GB/s), so it can run there in 200 us. The bound at kit.comm's achieved rates
    # (0.975 of each NVLink, and 2.75 HBM bytes a byte at 900 GB/s) was 0.236 ms: replayed on
    # dgx1-v100 itself it had been clamped up to 236 us and said to have run elsewhere
    nbytes = 15 * MIB
    line = _bound_ms("allreduce", nbytes, "dgx1-v100", list(range(8)))
    assert line == pytest.approx(0.18350, abs=1e-5) and line < MEASURED_US / 1e3
    durs, notes = comm_us(job(tmp_path, V100, _allreduce(nbytes // 4), "ncclKernel_AllReduce_RING_LL_Sum_float"),
                          on="dgx1-v100")
    assert durs == pytest.approx({r: MEASURED_US for r in range(8)}, rel=1e-9)
    assert not any("ran faster" in n for n in notes), notes


def test_a_named_source_the_trace_beats_is_said_without_asking_for_from(tmp_path):
    # the 200 us all-reduce of 64 MiB beats dgx1-v100's links (0.783 ms of bytes) with --from
    # dgx1-v100 given too: the note had told the user to name the system with --from, as they had
    d = job(tmp_path, V100, _allreduce(16 << 20), "ncclKernel_AllReduce_RING_LL_Sum_float")
    notes = replay(d, on="dgx-h100", source="dgx1-v100").to_dict()["notes"]
    said = [n for n in notes if "collective(s) ran faster than dgx1-v100's links" in n]
    assert len(said) == 1 and "name its system with" not in said[0], notes
    assert ("the trace was not recorded there, though --from/source= 'dgx1-v100' names it; name the "
            "system it ran on" in said[0]), said
