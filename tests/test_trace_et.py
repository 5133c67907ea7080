"""kit.trace with PyTorch execution traces (ET): parsing both layouts, linking to Kineto, the
data dependencies it adds to the replay graph, pairing, and malformed input."""
import gzip
import json
import os
import tarfile
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.trace import load_kineto, replay
from kit.trace.et import data_edges, load_et, parse_et
from kit.trace.link import link

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
INPUTS = SHARED / "data/traces/param/et_replay/tests/inputs"
HTA_ET = SHARED / "data/traces/HolisticTraceAnalysis/tests/data/execution_trace"


def ev(cat, name, ts, dur, tid=1, pid=42, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def kineto_doc(rfid=False):
    """One step, 1000..1140 µs. aten::mm -> sgemm on stream 7 (1012-1112); aten::relu ->
    elementwise on stream 30 (1016-1125), unrelated data; aten::add reads mm's output -> add
    kernel on stream 20 waits for sgemm (1112-1122); aten::item reads add's output: a D2H copy on
    stream 20 (1122-1124) and cudaStreamSynchronize 1050-1126. External ids are rf_id + 1."""
    def op(name, ts, dur, ext):
        a = {"External id": ext}
        if rfid:
            a["Record function id"] = ext - 1
        return ev("cpu_op", name, ts, dur, **a)

    e = [ev("user_annotation", "ProfilerStep#1", 1000, 140, **{"External id": 1}),
         op("aten::mm", 1000, 12, 2),
         ev("cuda_runtime", "cudaLaunchKernel", 1002, 10, correlation=10),
         ev("kernel", "volta_sgemm_128x64_nn", 1012, 100, tid=7, pid=0, stream=7, correlation=10),
         op("aten::relu", 1012, 8, 3),
         ev("cuda_runtime", "cudaLaunchKernel", 1013, 5, correlation=14),
         ev("kernel", "elementwise_kernel", 1016, 109, tid=30, pid=0, stream=30, correlation=14),
         op("aten::add", 1020, 20, 4),
         ev("cuda_runtime", "cudaLaunchKernel", 1025, 10, correlation=11),
         ev("kernel", "add_kernel", 1112, 10, tid=20, pid=0, stream=20, correlation=11),
         op("aten::item", 1040, 99, 5),
         op("aten::_local_scalar_dense", 1041, 97, 6),
         ev("cuda_runtime", "cudaMemcpyAsync", 1045, 5, correlation=12),
         ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1122, 2, tid=20, pid=0, stream=20,
            correlation=12),
         ev("cuda_runtime", "cudaStreamSynchronize", 1050, 76, correlation=13)]
    return {"distributedInfo": {"rank": 0, "world_size": 1},
            "deviceProperties": [{"name": "Tesla V100-SXM2-32GB"}], "traceEvents": e}


def tensor(i):
    return [i, i, 0, 16, 4, "cuda:0"]


def et_doc(chakra=False, pid=42):
    ops = [  # (id, rf_id, name, inputs, outputs)
        (10, 1, "aten::mm", [100, 101], [102]),
        (11, 2, "aten::relu", [200], [201]),
        (12, 3, "aten::add", [102, 103], [104]),
        (13, 4, "aten::item", [104], []),
        (14, 5, "aten::_local_scalar_dense", [104], []),
    ]
    parent = {10: 2, 11: 2, 12: 2, 13: 2, 14: 13}
    nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "rf_id": 0,
              "parent": 1, "tid": 0, "inputs": [], "input_types": [], "outputs": [],
              "output_types": []}]
    for nid, rf, name, ins, outs in ops:
        iv, it = [tensor(i) for i in ins], ["Tensor(float)"] * len(ins)
        ov, ot = [tensor(i) for i in outs], ["Tensor(float)"] * len(outs)
        if chakra:
            nodes.append({"id": nid, "name": name, "ctrl_deps": parent[nid],
                          "inputs": {"values": iv, "shapes": [[16]] * len(iv), "types": it},
                          "outputs": {"values": ov, "shapes": [[16]] * len(ov), "types": ot},
                          "attrs": [{"name": "rf_id", "type": "uint64", "value": rf},
                                    {"name": "tid", "type": "uint64", "value": 1}]})
        else:
            nodes.append({"id": nid, "name": name, "rf_id": rf, "parent": parent[nid], "tid": 1,
                          "inputs": iv + [1.0], "input_types": it + ["Double"], "outputs": ov,
                          "output_types": ot})
    return {"schema": "1.1.0-chakra.0.0.4" if chakra else "1.0.1", "pid": pid, "nodes": nodes}


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("chakra", [False, True])
def test_both_et_layouts_give_the_same_data_edges(chakra):
    et = parse_et(et_doc(chakra), "et.json")
    assert [n.name for n in et.nodes][:2] == ["aten::mm", "aten::relu"]  # root node dropped
    # hand-derived: add reads mm's output 102; item and _local_scalar_dense read add's 104
    # (item is the parent of _local_scalar_dense, so no edge between them)
    assert data_edges(et) == [(10, 12), (12, 13), (12, 14)]


@pytest.mark.parametrize("rfid", [False, True])
def test_link_maps_ops_kernels_and_data_flow(tmp_path, rfid):
    t = load_kineto(write(tmp_path / "k.json", kineto_doc(rfid)))[0]
    lk = link(parse_et(et_doc(), "et.json"), t)
    st = lk.stats(t)
    assert st["method"] == ("record function id" if rfid else "name alignment")
    assert (st["et_ops"], st["linked_ops"]) == (5, 5)
    assert (st["gpu_ops"], st["gpu_ops_linked"]) == (4, 4)
    # the add kernel (corr 11) reads what the sgemm (10) wrote; the sync (13) in
    # _local_scalar_dense waits on its own copy (12) and on the add kernel that wrote its input
    assert lk.kernel_inputs[11] == {10}
    assert lk.sync_inputs[13] == {11, 12}
    assert 14 not in lk.kernel_inputs  # relu reads a tensor no GPU op wrote


def test_replay_with_et_sets_deps_from_data_flow_and_transfers_them(tmp_path):
    from kit.hardware import get_gpu

    d = tmp_path / "run"
    d.mkdir()
    write(d / "rank0.json", kineto_doc())
    write(d / "et_rank0.json", et_doc())
    plain = replay(d, et=False)
    with_et = replay(d)  # found next to the Kineto file by its schema
    for r in (plain, with_et):
        assert r.ranks[0]["predicted_ms"] == pytest.approx(0.140, abs=1e-9)
    dd = with_et.to_dict()
    assert dd["execution_traces"][0]["linked_ops"] == 5
    assert dd["host_syncs"] == {"et": 1, "et_differs": 1}  # timing would pick the relu kernel
    assert dd["gpu_waits"] == {"et": 1}  # the add kernel waits on the sgemm, from the ET
    assert plain.to_dict()["host_syncs"] == {"timing": 1}

    # On an H100 the kernels shrink; hand-derived step with the ET's deps:
    v, h = get_gpu("v100-sxm2-32gb"), get_gpu("h100-sxm")
    gemm = 0.100 * v.fp32_tflops / h.fp32_tflops
    bw = v.mem_bw_gbs / h.mem_bw_gbs
    add = 0.002 + (0.010 - 0.002) * bw
    relu = 0.002 + (0.109 - 0.002) * bw
    pcie = {3: 16.0, 4: 32.0, 5: 64.0}
    copy = 0.002 * pcie[v.pcie_gen] / pcie[h.pcie_gen]
    copy_end = max(0.012 + gemm + add, 0.050) + copy  # add waits for sgemm; the copy for add
    et_step = max(copy_end, 0.050) + 0.002 + 0.014  # the sync's own 2 µs, then 14 µs of CPU
    on = replay(d, on="h100-sxm")
    assert on.ranks[0]["predicted_ms"] == pytest.approx(et_step, abs=1e-9)
    # without the ET the sync waits on whatever ended last before it returned: the relu kernel,
    # not the copy it was for; on the H100 the relu ends before the CPU reaches the sync
    timing_step = max(0.050, 0.016 + relu) + 0.001 + 0.014
    assert replay(d, on="h100-sxm", et=False).ranks[0]["predicted_ms"] == \
        pytest.approx(timing_step, abs=1e-9)


def test_explicit_et_option_and_cli(tmp_path, capsys):
    from kit.cli import main

    k = write(tmp_path / "k.json", kineto_doc())
    e = write(tmp_path / "e.json", et_doc())
    assert replay(k, et=e).to_dict()["execution_traces"][0]["linked_ops"] == 5
    assert main(["replay", str(k), "--et", str(e), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["execution_traces"][0]["gpu_ops_linked"] == 4
    assert main(["replay", str(k), "--et", str(e)]) == 0
    assert "5/5 ops linked" in capsys.readouterr().out
    bad = write(tmp_path / "bad.json", {"schema": "1.0.1", "nodes": [{"id": "x"}]})
    assert main(["replay", str(k), "--et", str(bad)]) == 2
    assert "node 0" in capsys.readouterr().err


@pytest.mark.parametrize("doc,match", [
    ({"schema": "1.0.1", "nodes": "no"}, "not a PyTorch execution trace"),
    ({"schema": "1.0.1", "nodes": [7]}, "each node must be a JSON object"),
    ({"schema": "1.0.1", "nodes": [{"id": 1}]}, "needs an integer 'id' and a string 'name'"),
    ({"schema": "1.0.1", "nodes": [{"id": 1, "name": "aten::mm", "inputs": 3}]},
     "must be a list of values"),
    ({"schema": "1.1.0", "nodes": [{"id": 1, "name": "a", "inputs": {}, "attrs": 5}]},
     "'attrs' must be a list"),
    ({"schema": "1.0.1", "nodes": [{"id": 1, "name": "a", "rf_id": 1}, {"id": 2, "name": "b"}]},
     "lack 'rf_id'"),
    ({"schema": "1.0.1", "nodes": []}, "no operator nodes"),
])
def test_malformed_et_is_one_kit_error(tmp_path, doc, match):
    k = write(tmp_path / "k.json", kineto_doc())
    with pytest.raises(KitError, match=match):
        replay(k, et=write(tmp_path / "e.json", doc))


def test_et_pairing_errors(tmp_path):
    k = write(tmp_path / "k.json", kineto_doc())
    with pytest.raises(KitError, match="not from the same process"):
        replay(k, et=write(tmp_path / "other.json", et_doc(pid=7)))
    with pytest.raises(KitError, match="no PyTorch execution trace"):
        replay(k, et=k)
    only = tmp_path / "only"
    only.mkdir()
    write(only / "e.json", et_doc())
    with pytest.raises(KitError, match="only 1 PyTorch execution traces"):
        replay(only)
    with pytest.raises(KitError, match="has 'nodes' but no 'schema'"):
        load_et(write(tmp_path / "n.json", {"nodes": []}))


@pytest.mark.skipif(not HTA_ET.exists(), reason="HTA execution_trace fixture not present")
def test_hta_et_kineto_pair():
    r = replay(HTA_ET / "benchmark_simple_add_trace.json.gz",
               et=HTA_ET / "benchmark_simple_add_et.json.gz")
    x = r.to_dict()["execution_traces"][0]
    raw = json.loads(gzip.decompress((HTA_ET / "benchmark_simple_add_et.json.gz").read_bytes()))
    ops = [n for n in raw["nodes"] if not n["name"].startswith("[pytorch|profiler")]
    assert x["et_ops"] == len(ops) == 36 and x["linked_ops"] == 36
    assert x["gpu_ops_linked"] == x["gpu_ops"] == 4
    # aten::add (node 36) reads tensors 6 and 11, last written by the two aten::uniform_ (8, 13)
    edges = set(r.tg.links[0].edges)
    assert {(8, 36), (13, 36), (8, 58), (13, 58)} <= edges


@pytest.mark.skipif(not (INPUTS / "dlrm_pytorch_et.tar.gz").exists(), reason="DLRM ET absent")
def test_dlrm_with_et_links_every_op_and_still_replays_within_3_percent():
    et_path = INPUTS / "dlrm_pytorch_et.tar.gz"
    r = replay(INPUTS / "dlrm_kineto.tar.gz", et=et_path)
    d = r.to_dict()
    counts = {}
    with tarfile.open(et_path) as tf:
        for m in tf.getmembers():
            if m.isfile() and m.name.endswith(".json"):
                nodes = json.load(tf.extractfile(m))["nodes"]
                rank = int(Path(m.name).stem.split("_")[-1])
                counts[rank] = sum(1 for n in nodes if not n["name"].startswith("[pytorch|"))
    assert len(d["execution_traces"]) == 8
    for x in d["execution_traces"]:
        assert x["linked_ops"] == x["et_ops"] == counts[x["rank"]]
        assert x["gpu_ops_linked"] == x["gpu_ops"]  # every launched GPU op has its ET op
        assert x["sync_deps"] == 10
        # the main and autograd threads exchange tensors; the serial host thread of the replay
        # graph honours every one of the ET's dependencies (no consumer starts before its producer)
        assert x["data_edges_cross_thread"] > 50 and x["data_edges_backwards"] == 0
    assert d["host_syncs"]["et"] == 80 and d["host_syncs"]["et_same_as_timing"] == 80
    for row in d["ranks"]:
        assert abs(row["error_pct"]) < 3.0, row


@pytest.mark.skipif(not (INPUTS / "hf_GPT2_et.json.tar.gz").exists(), reason="GPT-2 ET absent")
def test_gpt2_chakra_et_parses_with_true_data_edges():
    with tarfile.open(INPUTS / "hf_GPT2_et.json.tar.gz") as tf:
        doc = json.load(tf.extractfile(tf.getmembers()[0]))
    et = parse_et(doc, "hf_GPT2_et.json")
    assert et.schema == "1.1.0-chakra.0.0.4"
    raw = doc["nodes"]
    by_id = {n["id"]: n for n in raw}
    assert len(et.nodes) == sum(1 for n in raw if not n["name"].startswith("[pytorch|"))
    edges = data_edges(et)
    assert len(edges) > 1000

    def tensors(vals):
        flat = [x for v in vals for x in (v if isinstance(v, list) and v and
                                          isinstance(v[0], list) else [v])]
        return {v[0] for v in flat if isinstance(v, list) and len(v) == 6 and isinstance(v[-1], str)}

    rf = {n.id: n.rf_id for n in et.nodes}
    for p, c in edges[:: max(1, len(edges) // 200)]:  # every edge: shared tensor, p ran first
        assert rf[p] < rf[c]
        assert tensors(by_id[p]["outputs"]["values"]) & tensors(by_id[c]["inputs"]["values"])


def test_a_stray_et_found_in_the_folder_is_noted_not_fatal(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write(d / "rank0.json", kineto_doc())
    write(d / "et_other_run.json", et_doc(pid=7))
    r = replay(d)
    assert r.ranks[0]["predicted_ms"] == pytest.approx(0.140, abs=1e-9)
    assert not r.to_dict()["execution_traces"]
    assert any("not used" in n and "not from the same process" in n for n in r.to_dict()["notes"])
    with pytest.raises(KitError, match="not from the same process"):
        replay(d / "rank0.json", et=d / "et_other_run.json")


def test_alignment_finds_the_profiled_iteration_and_resyncs_after_gaps():
    from kit.trace.kineto import parse_events

    names = ["aten::mm", "aten::relu", "aten::add", "aten::sum", "aten::mul", "aten::div"]
    e = []
    for it in range(3):  # three iterations of the same ops; External ids 1.., 10 µs apart
        for k, name in enumerate(names):
            ext = 1 + it * len(names) + k
            e.append(ev("cpu_op", name, 1000 + 10 * ext, 5, **{"External id": ext}))
    e.append(ev("cpu_op", "aten::extra", 1000 + 10 * 9 + 5, 1, **{"External id": 99}))
    t = parse_events({"traceEvents": e}, "k.json", 0)
    # the ET recorded the second iteration (rf_id = External id - 1), without its aten::sum
    nodes = [{"id": 100 + k, "name": n, "rf_id": 6 + k, "parent": 1, "tid": 1, "inputs": [],
              "input_types": [], "outputs": [], "output_types": []}
             for k, n in enumerate(names) if n != "aten::sum"]
    lk = link(parse_et({"schema": "1.0.1", "pid": None, "nodes": nodes}, "et.json"), t)
    linked = {n: t.cpu_ops[i] for n, i in lk.op_of_node.items()}
    assert len(linked) == 5
    assert all(op.ext_id == (n - 100) + 7 for n, op in linked.items())  # all from iteration 2


EG = SHARED / "data/traces/moderato_param/train/compute/python/examples/pytorch/my_eg_jsons"


@pytest.mark.skipif(not (EG / "alex_net.json").exists(), reason="moderato_param EG absent")
def test_schema_1_0_0_tensors_without_device():
    et = load_et(EG / "alex_net.json")[0]
    assert et.schema == "1.0.0" and len(et.nodes) == 397  # 400 nodes less 3 roots
    # aten::zeros (12) = aten::empty (13) writing tensor 5, then aten::zero_ (15) on tensor 5
    assert (13, 15) in data_edges(et)
