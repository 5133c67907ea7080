"""exhaustive() refuses a case too large to enumerate with its own message, however large: the
count of plans had been a float product, inf past ~10^308 plans (300 tables of 40 placements on
dgx-a100), and int(inf) ended in an OverflowError traceback."""
import pytest

from kit.embedding import Table
from kit.errors import KitError
from kit.sharding import ShardingModel, exhaustive

from sharding_support import StandInComm, StandInSystem


def _model(n_tables):
    tables = [Table(rows=1000 + i, dim=64, pooling=4, name=f"t{i}") for i in range(n_tables)]
    return ShardingModel(tables, StandInSystem(world=8, gpus_per_node=8), comm=StandInComm(), kinds=("tw",))


def test_a_case_past_floats_range_is_refused_in_words():
    m = _model(400)  # 8^400 plans: about 10^361
    with pytest.raises(KitError, match=r"about 10\^361 plans"):
        exhaustive(m)


def test_the_limit_is_exact_at_its_edge():
    m = _model(3)  # 8^3 = 512 plans
    with pytest.raises(KitError, match="512 plans"):
        exhaustive(m, max_plans=511)
    choice, cost, n = exhaustive(m, max_plans=512)
    assert n == 512 and len(choice) == 3


def test_a_count_past_pythons_digit_limit_is_refused_in_words():
    """8^4800 plans (4,800 tables of 8 placements) has 4,335 digits: str() of it is a
    ValueError past Python's 4,300-digit limit, which the message's count had ended in. Only the
    placements per table enter the count, so a stand-in with them is the model here (a real one
    of 4,800 tables takes ~5 s to build)."""
    from types import SimpleNamespace

    import numpy as np

    stand_in = SimpleNamespace(n_options=np.full(4800, 8), tables=[None] * 4800)
    with pytest.raises(KitError, match=r"about 10\^4334 plans"):
        exhaustive(stand_in)
