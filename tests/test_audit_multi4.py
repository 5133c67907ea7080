"""Fourth audit of the multi-GPU surface: malformed Kineto traces (steps of 0 µs, a kernel longer
than the run), files of other runs or other kinds in a trace folder, layouts that leave whole
nodes idle or settings that do nothing, and size lists with a lost item."""
import json
import warnings

import pytest

from kit.errors import KitError
from kit.trace.kineto import load_kineto, read_json_text
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)
from test_replay_audit import A100, ev, nccl_rank


def _doc(steps=((0, 100),), kernel=(30, 20)):
    events = [ev(f"ProfilerStep#{i + 1}", s, d, "cpu_op") for i, (s, d) in enumerate(steps)]
    events += [ev("aten::mm", 10, 20, "cpu_op"), ev("cudaLaunchKernel", 12, 5, "cuda_runtime", correlation=3),
               ev("sgemm", kernel[0], kernel[1], "kernel", tid=7, correlation=3, stream=7)]
    return {"deviceProperties": [{"name": A100}], "traceEvents": events}


def test_a_trace_whose_steps_all_last_zero_is_refused():
    with pytest.raises(KitError, match="every ProfilerStep annotation .* lasts 0"):
        read_json_text(json.dumps(_doc(steps=((0, 0),))))


def test_a_zero_step_among_others_is_left_out_with_a_note():
    t = read_json_text(json.dumps(_doc(steps=((0, 0), (0, 100)))))
    assert t.measured_steps_ms == [0.1]
    assert any("skipped 1 ProfilerStep annotation(s) of 0" in n for n in t.notes)


def test_a_kernel_longer_than_the_run_is_refused_or_noted():
    with pytest.raises(KitError, match="'sgemm' lasts 1e\\+12 µs, more than ten times the whole host"):
        read_json_text(json.dumps(_doc(kernel=(30, 1e12))))
    t = read_json_text(json.dumps(_doc(kernel=(30, 150))))  # past its step: kept, no note
    assert t.gpu and not any("past the host window" in n for n in t.notes)
    cut = read_json_text(json.dumps(_doc(kernel=(30, 8000))))  # a capture cut before its sync
    assert cut.gpu[0].dur_us == 8000 and any("past the host window" in n for n in cut.notes)


def test_files_of_two_gpus_are_noted_and_renumbered_notes_name_the_new_rank(tmp_path):
    d = tmp_path / "mix"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(nccl_rank(0, 2, 100)))
    other = _doc()
    other["deviceProperties"] = [{"name": "NVIDIA GeForce RTX 2080 Ti"}]
    other["traceEvents"] = [e for e in other["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    (d / "b.json").write_text(json.dumps(other))  # no distributedInfo, no ProfilerStep
    ranks = load_kineto(d)
    assert [r.rank for r in ranks] == [0, 1]
    notes = [n for r in ranks for n in r.notes]
    assert any("different GPUs" in n and "2080 Ti on rank(s) 1" in n for n in notes)
    assert any(n.startswith("rank 1: no ProfilerStep") for n in ranks[1].notes), ranks[1].notes
    assert not any("no ProfilerStep" in n for n in ranks[0].notes)
    spaced = nccl_rank(1, 2, 100)
    spaced["deviceProperties"] = [{"name": " " + A100.removeprefix("NVIDIA ") + "  "}]
    (d / "b.json").write_text(json.dumps(spaced))  # the same GPU, written another way
    assert not any("different GPUs" in n for r in load_kineto(d) for n in r.notes)


def test_a_folder_skips_json_that_is_no_kineto_trace(tmp_path, capsys):
    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(nccl_rank(0, 1, 100)))
    (d / "label.json").write_text(json.dumps({"e2e_latency": 5.0}))
    (d / "kit_trace.json").write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "x"}]}))
    ranks = load_kineto(d)
    assert len(ranks) == 1 and any("skipped 2 JSON file(s) that are no Kineto trace" in n
                                   for n in ranks[0].notes)
    only = tmp_path / "none"
    only.mkdir()
    (only / "label.json").write_text("{}")
    (only / "other.json").write_text("[]")
    with pytest.raises(KitError, match="none of its 2 JSON files is a Kineto trace"):
        load_kineto(only)
    with pytest.raises(KitError, match="not a Kineto trace"):  # a single file: its own error
        load_kineto(only / "label.json")
    rc, out, err = _kit(capsys, "replay", str(d), "--trace", str(d / "out.json"))
    assert rc == 2 and "in the input folder" in err and not (d / "out.json").exists()


# -- multi-GPU layouts -------------------------------------------------------------------------
M = "gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=50257"


def test_a_preset_with_whole_idle_nodes_says_so_and_how_to_leave_them_out(capsys):
    rc, out, err = _kit(capsys, "predict", M, "--system", "dgx-a100-x2", "--dp", "8", "--json")
    assert rc == 0 and "fill 1 of dgx-a100-x2's 2 nodes" in err
    assert "give dgx-a100 with --nodes 1" in err  # advice that runs:
    rc, out, err2 = _kit(capsys, "predict", M, "--system", "dgx-a100", "--nodes", "1", "--dp", "8", "--json")
    assert rc == 0 and "nodes" not in err2
    rc, _, err = _kit(capsys, "predict", M, "--system", "dgx-a100", "--nodes", "2", "--dp", "8")
    assert rc == 2 and "--nodes 2 gives 16 GPUs" in err
    rc, _, err = _kit(capsys, "predict", M, "--system", "dgx-a100-x2", "--dp", "12", "--json")
    assert rc == 0 and "idle" not in err  # part of the second node: a job on some of its GPUs


@pytest.mark.parametrize("args,word", [(["--pp", "5"], "24 layers do not split evenly over 5"),
                                       (["--pp", "4", "--virtual-stages", "5", "--schedule", "interleaved",
                                         "--global-batch", "8"], "pp 4 x 5 virtual stages = 20 model chunks"),
                                       (["--tp", "8", "--zero", "3"], "ZeRO stage 3 (--zero) shards"),
                                       (["--tp", "8", "--no-overlap"], "(--no-overlap, overlap_grad_reduce=False)")])
def test_settings_that_are_uneven_or_idle_get_a_note(capsys, args, word):
    rc, out, err = _kit(capsys, "predict", M, "--system", "dgx-a100", *args, "--json")
    assert rc == 0 and word in err and json.loads(out)
    rc, out, err = _kit(capsys, "predict", M, "--system", "dgx-a100", "--pp", "4", "--dp", "2", "--json")
    assert rc == 0 and "split evenly" not in err and "shards over" not in err


def test_the_api_refuses_sequence_parallel_without_tp():
    from kit.api import predict_multi_gpu

    with pytest.raises(KitError, match="with tp 1 it changes nothing"):
        predict_multi_gpu(M, "dgx-a100", dp=8, sequence_parallel=True)


# -- collective sizes and fits -----------------------------------------------------------------
@pytest.mark.parametrize("argv,word", [(["comm", "predict", "allreduce", "--sizes", "1K,,2K", "--system", "dgx-a100"],
                                        "an empty item"),
                                       (["comm", "predict", "allreduce", "--bytes", "1M", "--system", "dgx-a100",
                                         "--ranks", "0,,1"], "--ranks takes")])
def test_a_list_with_an_empty_item_is_refused(capsys, argv, word):
    rc, _, err = _kit(capsys, *argv)
    assert rc == 2 and word in err
    from kit.comm.sizes import parse_sizes

    assert parse_sizes("1K,2K,") == [1024, 2048]  # a trailing comma loses nothing


def test_a_fit_says_how_many_measurements_it_left_out():
    from kit.comm.curves import fit_curve

    sizes = [2 ** k for k in range(10, 22)]
    times = [5 + s / 2e4 for s in sizes]
    times[3] = 0.0
    with pytest.warns(UserWarning, match="1 of 12 measurement"):
        c = fit_curve("allreduce", 8, sizes, times)
    assert c.n_points == 11
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_curve("allreduce", 8, sizes, [5 + s / 2e4 for s in sizes])  # none left out: no note
