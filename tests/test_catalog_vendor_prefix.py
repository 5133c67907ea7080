"""GPU names with or without their vendor words (NVIDIA, Tesla) are one GPU, as drivers write
them either way; a stripped name that two GPUs share finds neither."""
import json

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, list_gpus, register_gpu, unregister_gpu
from kit.trace import replay
from kit.trace.kineto import load_kineto
from tests.test_trace import rank_trace


def _names():
    return sorted({n for g in list_gpus() if g.vendor == "nvidia" for n in (g.name, *g.aliases)})


@pytest.mark.parametrize("name", _names())
def test_a_name_read_with_another_vendor_prefix_is_the_same_gpu(name):
    key = get_gpu(name).key
    bare = name
    for word in ("NVIDIA ", "Tesla "):
        bare = bare.removeprefix(word)
    for prefix in ("", "NVIDIA ", "Tesla ", "NVIDIA Tesla "):
        assert get_gpu(prefix + bare).key == key, prefix + bare


def test_nvidia_v100_sxm2_32gb_is_the_catalog_v100():
    # kineto._gpu_key's comment said so, but the catalog only knew "Tesla V100-SXM2-32GB"
    assert get_gpu("NVIDIA V100-SXM2-32GB").key == "v100-sxm2-32gb"
    assert get_gpu(" NVIDIA Tesla V100-SXM2-32GB ").key == "v100-sxm2-32gb"


def test_only_whole_vendor_words_are_stripped():
    with pytest.raises(KitError, match="unknown GPU"):
        get_gpu("NVIDIAV100-SXM2-32GB")  # the vendor glued on: no name a driver writes
    for word in ("NVIDIA", "Tesla", "NVIDIA Tesla"):
        with pytest.raises(KitError, match="unknown GPU"):
            get_gpu(word)


def test_a_stripped_name_two_gpus_share_finds_neither():
    a = {**get_gpu("t4").to_dict(), "key": "zz-foo-a", "name": "NVIDIA ZZ Foo", "aliases": []}
    b = {**get_gpu("t4").to_dict(), "key": "zz-foo-b", "name": "Tesla ZZ Foo", "aliases": []}
    try:
        register_gpu(a)
        register_gpu(b)
        assert get_gpu("NVIDIA ZZ Foo").key == "zz-foo-a"  # each one's own name is its own
        assert get_gpu("Tesla ZZ Foo").key == "zz-foo-b"
        with pytest.raises(KitError, match="unknown GPU"):
            get_gpu("ZZ Foo")
    finally:
        unregister_gpu("zz-foo-a")
        unregister_gpu("zz-foo-b")


def test_ranks_naming_the_v100_both_ways_are_one_gpu_and_replay_on_another(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(rank_trace(0, gpu="Tesla V100-SXM2-32GB")))
    (d / "rank1.json").write_text(json.dumps(rank_trace(1, gpu="NVIDIA V100-SXM2-32GB")))
    assert not any("different GPUs" in n for r in load_kineto(d) for n in r.notes)
    (d / "rank0.json").write_text(json.dumps(rank_trace(0, gpu="NVIDIA V100-SXM2-32GB")))
    r = replay(d, on="h100-sxm").to_dict()  # had been "the trace's GPU is not in the catalog"
    assert all(x["predicted_ms"] < x["measured_ms"] for x in r["ranks"])
