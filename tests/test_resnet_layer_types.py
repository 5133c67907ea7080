"""ResNet configs of HF's other layouts (transformers' ResNetConfig): layer_type "basic" (two 3x3
convs a block: ResNet-18 and -34, as microsoft/resnet-18's config.json has it) and
downsample_in_bottleneck (the stride on the first 1x1 conv: the paper's ResNet v1). The zoo's
ResNet had read neither and built bottlenecks for every config: microsoft/resnet-18's config
came out 1.40M parameters and 0.26e9 multiply-adds, against torchvision's 11.69M and 1.81e9.
And an HF config.json names its classes in id2label, with no num_labels."""
import warnings

import pytest

from kit.errors import KitError
from kit.workload import zoo

RESNET18 = {"model_type": "resnet", "layer_type": "basic", "embedding_size": 64,
            "hidden_sizes": [64, 128, 256, 512], "depths": [2, 2, 2, 2], "num_channels": 3,
            "num_labels": 1000, "image_size": 224}


def _params(cfg):
    return sum(p.numel() for p in zoo.build(cfg).parameters())


def _forward_macs(cfg):
    g = zoo.graph_for(cfg, batch=1, mode="inference", disk=False)
    assert not g.unknown_ops()
    return sum(n.op.flops for n in g.kernels() if n.op_class == "gemm") / 2


@pytest.mark.parametrize("depths, params, gmacs", [
    ([2, 2, 2, 2], 11_689_512, 1.81),  # torchvision resnet18: its docs' parameters and GFLOPS
    ([3, 4, 6, 3], 21_797_672, 3.66),  # resnet34
])
def test_basic_block_resnets_are_torchvisions(depths, params, gmacs):
    cfg = {**RESNET18, "depths": depths}
    assert _params(cfg) == params
    assert _forward_macs(cfg) == pytest.approx(gmacs * 1e9, rel=0.01)


def test_the_stride_on_the_first_1x1_conv_is_the_papers_resnet50():
    """He et al. 2016, Table 1: 3.8e9 multiply-adds (v1: the stride on the bottleneck's first 1x1
    conv); torchvision's v1.5 (the stride on the 3x3) is 4.1e9; the weights are the same."""
    v15 = zoo.config("resnet50")
    v1 = {**v15, "downsample_in_bottleneck": True}
    assert _params(v1) == _params(v15)
    assert _forward_macs(v1) == pytest.approx(3.8e9, rel=0.03)
    assert _forward_macs(v15) == pytest.approx(4.1e9, rel=0.02)


def test_downsample_in_first_stage_quarters_every_stages_pixels():
    """Stride 2 in the first stage too: every stage after the stem runs a quarter of the pixels
    (56x56 -> 28x28 ... 7x7 -> 4x4), and the stem (0.12e9) and the classifier are unchanged."""
    cfg = zoo.config("resnet50")
    base, strided = _forward_macs(cfg), _forward_macs({**cfg, "downsample_in_first_stage": True})
    assert 0.25 * base < strided < 0.35 * base


@pytest.mark.parametrize("change", [{"layer_type": "preactivation"}, {"layer_type": 3},
                                    {"downsample_in_bottleneck": "yes"},
                                    {"layer_type": "bottleneck", "hidden_sizes": [2, 4, 8, 16]}])
def test_an_unknown_resnet_layout_is_a_kit_error(change):
    with pytest.raises(KitError, match="resnet config"):
        zoo.build({**RESNET18, **change})


@pytest.mark.parametrize("name", ["resnet50", "vit-b16"])
def test_an_hf_config_json_counts_its_classes_in_id2label(name):
    """microsoft/resnet-50's and google/vit-base-patch16-224's config.json list 1,000 classes in
    id2label and have no num_labels (HF's PretrainedConfig derives it); they had been refused."""
    cfg = {k: v for k, v in zoo.config(name).items() if k != "num_labels"}
    labels = {str(i): f"class {i}" for i in range(1000)}
    assert _params({**cfg, "id2label": labels}) == _params(zoo.config(name))
    assert _params({**cfg, "id2label": dict(list(labels.items())[:10])}) < _params(zoo.config(name))
    with pytest.raises(KitError, match="missing key 'num_labels'"):
        zoo.build(cfg)  # neither: still named


def test_id2label_sets_the_classes_over_a_disagreeing_num_labels_as_hf_does():
    """HF's PretrainedConfig takes num_labels from id2label where both are given (a mismatch is
    a logged warning): a config of 1,000 labels and num_labels 10 builds a 1,000-class head.
    The kit had built 10."""
    cfg = {**RESNET18, "num_labels": 10, "id2label": {str(i): f"class {i}" for i in range(1000)}}
    with pytest.warns(UserWarning, match="num_labels 10 disagrees"):
        head = zoo.build(cfg).fc
    assert head.out_features == 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # agreeing counts are no mismatch
        assert zoo.build({**cfg, "num_labels": 1000}).fc.out_features == 1000
