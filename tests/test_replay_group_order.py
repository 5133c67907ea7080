"""kit replay: where every collective names its process group (torch 2.13's record_param_comms
fields: "Process Group Ranks", "Process Group Name", "Seq", a send's "Dst Rank" and a recv's
"Src Rank"; torch/include/torch/csrc/profiler/util.h:190-206), the i-th collective of a group on
one rank is matched with the i-th of the same group on its other ranks (kit.trace.group_sync), a
send with its peer's recv. Matched by position on each rank's NCCL stream across the job, a job
whose groups run different numbers of collectives (pipeline stages) had not been synchronised.

Each synthetic job is written as a run of synchronised collectives would record it: a
collective's kernel starts when its rank reaches it and ends when its last member's arrival plus
its own time (ACTUAL_US) has passed, so the measured kernel of a rank that arrived early holds
its wait. The replayed duration of each collective is then its ACTUAL_US, and each step is worked
out by hand from the schedule below."""
import json

import pytest

from kit.trace import replay

A100 = "NVIDIA A100-SXM4-40GB"
GEMM = "ampere_sgemm_128x64_nn"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float"
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
STREAM = {"gemm": 7, "tp": 8, "dp": 9, "p2p": 10}


def ev(name, ts, dur, cat, tid=1, **a):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": tid, "args": a}


def group(name, ranks, r, seq=None, **extra):
    f = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 20,
         "Out msg nelems": 1 << 20, "Group size": len(ranks), "Global rank start": ranks[0],
         "Global rank stride": ranks[1] - ranks[0], "Process Group Name": name,
         "Process Group Ranks": json.dumps(list(ranks)), "Rank": ranks.index(r), **extra}
    return f if seq is None else {**f, "Seq": seq}


def p2p(kind, r, peer):
    pair = sorted((r, peer))
    return group("3", pair, r, **{"Collective name": kind, ("Dst Rank" if kind == "send" else "Src Rank"): peer})


def write_job(d, kernels):
    """kernels: rank -> [(what, start_us, dur_us, fields or None)] in launch order; each launched
    3 us after the one before, a comm one under a record_param_comms of its fields; then a
    cudaStreamSynchronize that returns 2 us after the last kernel and the step 8 us later."""
    d.mkdir()
    for r, ks in kernels.items():
        end = max(s + du for _, s, du, _ in ks)
        events = [ev("ProfilerStep#1", 0, end + 10, "cpu_op")]
        for i, (what, start, dur, fields) in enumerate(ks):
            name = GEMM if what == "gemm" else SENDRECV if what == "p2p" else ALLREDUCE
            t = 3 + 3 * i
            if fields is not None:
                events.append(ev("record_param_comms", t - 1, 3, "cpu_op", **fields))
            events += [ev("cudaLaunchKernel", t, 1, "cuda_runtime", correlation=10 + i),
                       ev(name, start, dur, "kernel", tid=STREAM[what], correlation=10 + i,
                          stream=STREAM[what])]
        events.append(ev("cudaStreamSynchronize", 30, end + 2 - 30, "cuda_runtime", correlation=99))
        (d / f"rank{r}.json").write_text(json.dumps({
            "distributedInfo": {"rank": r, "world_size": len(kernels)},
            "deviceProperties": [{"name": A100}], "traceEvents": events}))
    return d


def replayed(d, on=None):
    r = replay(d, on=on) if on else replay(d)
    g = r.tg.graph
    durs = {rank: [round(1e3 * g.dur_ms[op], 9) for op, *_ in ops if g.kind[op] == "comm"]
            for rank, ops in r.tg.gpu_ops.items()}
    gemm = {rank: [1e3 * g.dur_ms[op] for op, *_ in ops if g.kind[op] == "compute"]
            for rank, ops in r.tg.gpu_ops.items()}
    steps = {x["rank"]: 1e3 * x["predicted_ms"] for x in r.to_dict()["ranks"]}
    return durs, gemm, steps, r.to_dict()["notes"]


# TP pairs {0, 1}, {2, 3}; DP pairs {0, 2}, {1, 3}. GEMMs end at 10 + C; TP all-reduces take
# 50 us ({0, 1}) and 70 us ({2, 3}) once both are there: they end at 310 + 50 = 360 and
# 410 + 70 = 480. DP all-reduces take 30 us ({0, 2}) and 20 us ({1, 3}): 480 + 30 = 510 and
# 480 + 20 = 500. Steps: the last collective's end + 10.
C = {0: 100, 1: 300, 2: 200, 3: 400}
TP_END = {0: 360, 1: 360, 2: 480, 3: 480}
DP_END = {0: 510, 1: 500, 2: 510, 3: 500}


def tp_dp_job(d, seq_of=lambda r, which: None):
    ks = {}
    for r in range(4):
        tp, dp = ((0, 1) if r < 2 else (2, 3)), ((0, 2) if r % 2 == 0 else (1, 3))
        ks[r] = [("gemm", 10, C[r], None),
                 ("tp", 10 + C[r], TP_END[r] - 10 - C[r], group("1" if r < 2 else "2", tp, r, seq_of(r, "tp"))),
                 ("dp", TP_END[r], DP_END[r] - TP_END[r], group("4" if r % 2 == 0 else "5", dp, r, seq_of(r, "dp")))]
    return write_job(d, ks)


def test_tp_and_dp_pairs_each_synchronise_their_own_group(tmp_path):
    durs, _, steps, notes = replayed(tp_dp_job(tmp_path / "j"))
    # tied across the job, each would take the job's shortest: 50 and 20 on every rank
    assert durs == {0: [50, 30], 1: [50, 20], 2: [70, 30], 3: [70, 20]}
    assert steps == pytest.approx({r: DP_END[r] + 10 for r in range(4)}, abs=1e-6)
    assert any(x.startswith("8 collective(s) synchronised within the process groups") for x in notes)


def test_groups_whose_seq_disagree_are_not_matched_by_order(tmp_path):
    # rank 1 numbers its TP all-reduce 8 where rank 0 numbers it 7: not one collective by torch's
    # count, so the order within the group is not trusted; the note says which group and why
    d = tp_dp_job(tmp_path / "j", lambda r, which: 8 if (r, which) == (1, "tp") else 7)
    *_, notes = replayed(d)
    assert any("the process groups the trace names do not agree across ranks (group (0, 1) '1' runs "
               "Seq 8-8 (1) on rank 1, 7-7 (1) on rank 0)" in x for x in notes), notes


# Pipeline of two stages, each a TP pair: stage 0 = ranks 0, 1; stage 1 = ranks 2, 3 (0 sends to
# 2, 1 to 3). Stage 0: GEMM, TP all-reduce, send; stage 1: recv, GEMM, two TP all-reduces. The
# ranks run 2 and 3 collectives, so no position on an NCCL stream is the same collective on all.
PP_ACTUAL = {"tp01": 50, "p02": 40, "p13": 60, "tp23a": 30, "tp23b": 20}


def pp_job(d):
    a = PP_ACTUAL
    tp01 = 10 + max(C[0], C[1]) + a["tp01"]  # 360
    p_end = {0: tp01 + a["p02"], 1: tp01 + a["p13"]}  # 400, 420
    gemm_end = {2: p_end[0] + 100, 3: p_end[1] + 50}  # 500, 470
    tp23a = max(gemm_end.values()) + a["tp23a"]  # 530
    tp23b = tp23a + a["tp23b"]  # 550
    ks = {}
    for r in (0, 1):
        ks[r] = [("gemm", 10, C[r], None),
                 ("tp", 10 + C[r], tp01 - 10 - C[r], group("1", (0, 1), r)),
                 ("p2p", tp01, p_end[r] - tp01, p2p("send", r, r + 2))]
    for r in (2, 3):
        ks[r] = [("p2p", 10, p_end[r - 2] - 10, p2p("recv", r, r - 2)),
                 ("gemm", p_end[r - 2], gemm_end[r] - p_end[r - 2], None),
                 ("tp", gemm_end[r], tp23a - gemm_end[r], group("2", (2, 3), r)),
                 ("tp", tp23a, tp23b - tp23a, group("2", (2, 3), r))]
    return write_job(d, ks)


def test_pipeline_stages_with_different_counts_synchronise_their_own_collectives(tmp_path):
    durs, _, steps, notes = replayed(pp_job(tmp_path / "j"))
    a = PP_ACTUAL
    assert durs == {0: [a["tp01"], a["p02"]], 1: [a["tp01"], a["p13"]],
                    2: [a["p02"], a["tp23a"], a["tp23b"]], 3: [a["p13"], a["tp23a"], a["tp23b"]]}
    assert steps == pytest.approx({0: 410, 1: 430, 2: 560, 3: 560}, abs=1e-6)
    assert not any("counts per stream differ" in x for x in notes), notes


def test_pipeline_stages_wait_for_each_other_when_the_gemms_shrink(tmp_path):
    # on an H100 (a GPU: collectives keep their replayed times) the GEMMs shrink; synchronised,
    # each stage waits only for what it waits on: hand schedule from the replayed GEMM times.
    # Unsynchronised, stage 1's recvs had kept their measured waits (390 and 410 us)
    durs, gemm, steps, _ = replayed(pp_job(tmp_path / "j"), on="h100-sxm")
    a = PP_ACTUAL
    tp01 = 10 + max(gemm[0][0], gemm[1][0]) + a["tp01"]
    p_end = {0: tp01 + a["p02"], 1: tp01 + a["p13"]}
    tp23 = max(p_end[0] + gemm[2][0], p_end[1] + gemm[3][0]) + a["tp23a"] + a["tp23b"]
    assert gemm[0][0] < 0.9 * C[0]
    assert steps == pytest.approx({0: p_end[0] + 10, 1: p_end[1] + 10, 2: tp23 + 10, 3: tp23 + 10},
                                  abs=1e-6)


def test_groups_that_share_no_rank_keep_their_own_clocks(tmp_path):
    # TP pairs only: ranks 2, 3 meet ranks 0, 1 in no collective, so nothing ties their clocks to
    # rank 0's (by stream position, rank 2's TP end, 480, had been paired with rank 0's, 360);
    # each pair replays its own schedule: the TP end + 10
    ks = {r: [("gemm", 10, C[r], None),
              ("tp", 10 + C[r], TP_END[r] - 10 - C[r], group("1" if r < 2 else "2", (0, 1) if r < 2 else (2, 3), r))]
          for r in range(4)}
    durs, _, steps, notes = replayed(write_job(tmp_path / "j", ks))
    assert durs == {0: [50], 1: [50], 2: [70], 3: [70]}
    assert steps == pytest.approx({r: TP_END[r] + 10 for r in range(4)}, abs=1e-6)
    assert ("rank(s) 2-3 share no collective, directly or through others, with rank 0: their "
            "clocks are aligned among their own, their first step with rank 0's") in notes


def tp_pairs_job(d, shift_us=0.0):
    """TP pairs {0, 1}, {2, 3} alone (no collective ties the pairs); ranks 2-3's clock (every
    event of their files) reads shift_us later, as on another host."""
    ks = {r: [("gemm", 10, C[r], None),
              ("tp", 10 + C[r], TP_END[r] - 10 - C[r], group("1" if r < 2 else "2", (0, 1) if r < 2 else (2, 3), r))]
          for r in range(4)}
    write_job(d, ks)
    for r in (2, 3):
        p = d / f"rank{r}.json"
        doc = json.loads(p.read_text())
        for e in doc["traceEvents"]:
            e["ts"] += shift_us
        p.write_text(json.dumps(doc))
    return d


def test_pairs_on_clocks_a_second_apart_start_their_steps_together(tmp_path):
    # nothing measures the offset between the pairs' clocks: each pair's first step starts with
    # the other's, so the job's critical path is the longer pair's step, TP_END[2] + 10 = 490 us
    # (at their raw clocks, ranks 2-3 had idled 1 s first: 1000.49 ms)
    r = replay(tp_pairs_job(tmp_path / "j", shift_us=1e6))
    d = r.to_dict()
    assert {x["rank"]: 1e3 * x["predicted_ms"] for x in d["ranks"]} == pytest.approx(
        {k: TP_END[k] + 10 for k in range(4)}, abs=1e-6)
    assert d["critical_path"]["total_ms"] == pytest.approx((TP_END[2] + 10) / 1e3, abs=1e-9)
    assert d["critical_path"]["idle"] == pytest.approx(0.0, abs=1e-9)


def test_a_rank_without_collectives_leaves_the_others_groups_synchronised(tmp_path):
    # ranks 0, 1: GEMM then their TP all-reduce (50 us once both are there, ends 360); rank 2:
    # a GEMM alone, in no group. The pair synchronises: 50 us each (rank 0's measured 250 held
    # its wait for rank 1), steps 360 + 10; rank 2's GEMM ends at 210, its step 220. Before,
    # rank 2's empty NCCL stream left every collective unsynchronised at its measured time
    ks = {r: [("gemm", 10, C[r], None), ("tp", 10 + C[r], TP_END[r] - 10 - C[r], group("1", (0, 1), r))]
          for r in (0, 1)}
    ks[2] = [("gemm", 10, 200, None)]
    durs, _, steps, notes = replayed(write_job(tmp_path / "j", ks))
    assert durs == {0: [50], 1: [50], 2: []}
    assert steps == pytest.approx({0: 370, 1: 370, 2: 220}, abs=1e-6)
    assert ("rank(s) 2 run no collective and are in no group the trace names: their steps start "
            "with the others', at no measured clock offset") in notes, notes
    assert not any("counts per stream differ" in x for x in notes), notes


def test_a_loop_of_groups_takes_each_offset_from_its_shortest_chain_in_any_order():
    # pairs 0-1, 1-2, 2-0; rank 1's clock reads 100 us later than rank 0's, rank 2's 250 us, and
    # the 1-2 pair's measured end on rank 2 is 6 us late (2 - 1 would say 156): rank 2 is one
    # hop from rank 0, so it takes 250 from their shared collective, whatever the order given
    import itertools
    from types import SimpleNamespace

    from kit.trace.group_sync import clock_offsets

    skew = {0: 0.0, 1: 100.0, 2: 250.0}

    def coll(ranks, end, late=None):
        return (("group", ranks, None, 0), {r: (None, SimpleNamespace(
            ts_us=end + skew[r] + (6.0 if r == late else 0.0) - 10.0, dur_us=10.0)) for r in ranks})

    loop = [coll((0, 1), 300.0), coll((1, 2), 400.0, late=2), coll((0, 2), 500.0)]
    for order in itertools.permutations(loop):
        offsets, root_of = clock_offsets(list(order), [0, 1, 2])
        assert offsets == {0: 0.0, 1: 100.0, 2: 250.0}
        assert root_of == {0: 0, 1: 0, 2: 0}


def test_a_rank_whose_collectives_name_no_group_is_said(tmp_path):
    # the TP/DP job with rank 3's record_param_comms fields left out: its 2 collectives name no
    # group while the 6 of ranks 0-2 do, so the group match is not used and, matched by stream
    # position, every rank's k-th collective is one; before, that was silent
    d = tp_dp_job(tmp_path / "j")
    p = d / "rank3.json"
    doc = json.loads(p.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["name"] != "record_param_comms"]
    p.write_text(json.dumps(doc))
    *_, notes = replayed(d)
    assert ("the process groups the trace names do not agree across ranks (2 of the job's 8 "
            "collectives, on rank(s) 3, name no process group while the others do); collectives "
            "matched by their position on each rank's NCCL stream") in notes, notes
