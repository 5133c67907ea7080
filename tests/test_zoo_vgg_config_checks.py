"""A VGG config whose layers or image size cannot build the model is one KitError naming the
field, before any capture."""
import pytest

from kit.errors import KitError
from kit.workload import zoo

VGG = zoo.config("vgg16")  # configuration D: five 'M' max pools


@pytest.mark.parametrize("layers", [[8, "X", 8], [8, "m"], [8, None]])
def test_a_layers_entry_that_is_no_width_nor_a_pool_is_named(layers):
    with pytest.raises(KitError, match=r"layers must be a list of positive whole numbers \(and 'M'"):
        zoo.graph_for({**VGG, "layers": layers, "image_size": 32}, 1, None, "inference", disk=False)


def test_an_image_smaller_than_the_pools_allow_is_named():
    with pytest.raises(KitError, match="image_size 31 is halved by 5 max pools .* at least 32"):
        zoo.graph_for({**VGG, "image_size": 31}, 1, None, "inference", disk=False)
    g = zoo.graph_for({**VGG, "image_size": 32}, 1, None, "inference", disk=False)  # 1x1 after the fifth
    assert sum(n.op_class == "pooling" for n in g) >= 5


def test_the_pool_marker_belongs_to_vggs_layers_alone():
    """An "M" in another family's list is no size: it had passed the check and reached
    torch.empty in DLRM's bottom MLP; and a bad list elsewhere is not told about max pools."""
    dlrm = zoo.config("dlrm")
    with pytest.raises(KitError, match=r"bottom_mlp must be a list of positive whole numbers, got"):
        zoo.graph_for({**dlrm, "bottom_mlp": [512, "M", 256]}, 1, None, "inference", disk=False)
    with pytest.raises(KitError, match="table_rows") as e:
        zoo.graph_for({**dlrm, "table_rows": [0] * 26}, 1, None, "inference", disk=False)
    assert "max pool" not in str(e.value)
