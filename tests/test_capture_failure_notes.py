"""The capture's failure messages (kit.workload.models, with
kit.workload.capture_errors.CaptureNotAboutInputs): the note on the token ids the kit fed a
module follows only a failure plausibly about those inputs, and example_inputs returning None is
named as such."""
import pytest
import torch.nn as nn

from kit.errors import KitError
from kit.workload.models import graph_of
from test_capture_copies_masks import CpuTensor, NoParams, OnCuda

NOTE = "token ids of shape"  # the guess the kit fed a module without example_inputs


@pytest.mark.parametrize("model, mode", [(CpuTensor(), "inference"), (OnCuda(), "inference"),
                                         (NoParams(), "train")], ids=["cpu-tensor", "cuda", "no-params"])
def test_a_failure_of_the_models_own_code_gets_no_note_on_the_token_ids(model, mode):
    with pytest.raises(KitError) as err:
        graph_of(model, 2, 8, mode=mode)
    assert NOTE not in str(err.value)


def test_a_failure_about_the_inputs_keeps_its_note():
    with pytest.raises(KitError, match=NOTE):
        graph_of(nn.Linear(16, 16), 2, 8, mode="inference")


def test_example_inputs_returning_none_is_named():
    class ExNone(nn.Linear):
        def example_inputs(self, batch, seq):
            return None

    with pytest.raises(KitError, match=r"ExNone.example_inputs\(2, 8\) returned None") as err:
        graph_of(ExNone(16, 16), 2, 8, mode="inference")
    assert "linear()" not in str(err.value)
