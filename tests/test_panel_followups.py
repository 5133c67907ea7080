"""Panel callbacks found wanting by driving every control: what a change must show in the panel."""
import warnings

from kit.hardware import get_system


def test_timeline_states_the_idle_nodes_of_a_multi_node_preset_in_its_summary():
    from widgets.timeline import TimelinePanel

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on stderr fails a notebook cell under nbval
        p = TimelinePanel(system="dgx-a100-ib-hdr-x4", dp=1, tp=2, pp=4, micro_batches=2)
        nodes = get_system("dgx-a100-ib-hdr-x4").nodes
        assert nodes > 1
        # 8 GPUs of 32: the summary had said "8 GPUs" and nothing about the 3 idle nodes
        assert f"fill 1 of dgx-a100-ib-hdr-x4's {nodes} nodes" in p.summary.value
        assert "--nodes" not in p.summary.value  # the CLI's remedy: no such control in the panel
        p.system.value = "dgx-a100"  # a single node: the note goes with the choice
        assert "idle" not in p.summary.value and "note" not in p.summary.value
        p.system.value = "dgx-h100-ib-ndr-x4"  # the second time too (warnings show once)
        assert "idle" in p.summary.value


def test_whole_model_dtype_fallback_does_not_depend_on_the_gpus_visited_on_the_way():
    from kit.hardware import get_gpu
    from widgets.whole_model import WholeModelPanel

    assert "bf16" not in get_gpu("rtx-2080-ti").dtypes and "fp16" in get_gpu("rtx-2080-ti").dtypes
    assert "fp16" not in get_gpu("p4").dtypes
    straight = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", dtype="bf16")
    straight.gpu.value = "rtx-2080-ti"
    detour = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", dtype="bf16")
    detour.gpu.value = "p4"  # fp32 only
    assert detour.dtype.value == "fp32"
    detour.gpu.value = "rtx-2080-ti"
    # the same controls and the same choice (bf16) give one answer: fp16, as the docstring says
    assert straight.dtype.value == detour.dtype.value == "fp16"  # the detour had kept fp32
    assert straight.summary.value == detour.summary.value
    detour.gpu.value = "a100-pcie-40gb"  # the reader's bf16 comes back
    assert detour.dtype.value == "bf16"


def test_whole_model_seq_fallback_does_not_depend_on_the_models_visited_on_the_way():
    from kit.workload.zoo import max_seq
    from widgets.whole_model import WholeModelPanel

    assert max_seq("gpt2") == 1024 and max_seq("bert-base") == 512 and max_seq("llama3-8b") is None
    kw = dict(model="llama3-8b", gpu="h100-sxm", mode="inference", seq=2048, dtype="bf16")
    straight, detour = WholeModelPanel(**kw), WholeModelPanel(**kw)
    straight.model.value = "gpt2"
    detour.model.value = "bert-base"
    assert detour.seq.value == 512
    detour.model.value = "gpt2"
    # one choice (2048), one model: the longest gpt2 offers either way (the detour had kept 512)
    assert straight.seq.value == detour.seq.value == max(s for s in straight.seq.options if s <= 2048)
    assert straight.summary.value == detour.summary.value
    detour.model.value = "llama3-8b"
    assert detour.seq.value == 2048  # the reader's choice comes back
