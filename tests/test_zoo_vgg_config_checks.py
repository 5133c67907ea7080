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
