"""--fusion compiled prices torch.compile, which Inductor cannot compile on a GPU of CUDA
capability under 7.0 (torch 2.13: torch/utils/_triton.py has_triton asks major >= 7, and
torch/_inductor/scheduler.py raises GPUTooOldForTriton without it). The P100 is capability 6.0
and the P4 6.1 (CUDA C++ Programming Guide's compute-capability table), so kit predict, the api,
kit compare and the whole-model panel refuse a compiled run there with the one reason
(kit.workload.inductor.fusion_refusal). --cuda-graphs alone (a CUDA graph over eager kernels,
torch.cuda.graphs) needs no Inductor and is still priced there."""
import json

import pytest

from kit.api import predict_model
from kit.cli import main
from kit.errors import KitError
from kit.hardware import get_gpu
from kit.workload.inductor import fusion_refusal

GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100,
       "n_positions": 128, "name": "tiny-gpt"}
P100 = "p100-pcie-16gb"


def test_fusion_refusal_names_the_card_and_only_pascal_with_compiled():
    why = fusion_refusal(get_gpu(P100), "compiled")
    assert why.startswith(f"{P100} (pascal, CUDA capability under 7.0)") and "--fusion eager" in why
    assert fusion_refusal(get_gpu(P100), "eager") is None
    assert fusion_refusal(get_gpu("v100-sxm2-16gb"), "compiled") is None  # Volta: capability 7.0


@pytest.mark.parametrize("mode", ["train", "inference", "decode"])
def test_api_refuses_compiled_on_pascal(mode):
    with pytest.raises(KitError) as e:
        predict_model(GPT, P100, mode=mode, batch=2, seq=16, fusion="compiled")
    assert str(e.value) == fusion_refusal(get_gpu(P100), "compiled")
    # eager, and a CUDA graph without compile, are priced on the same card
    assert predict_model(GPT, P100, mode=mode, batch=2, seq=16).total_ms > 0


def test_cli_predict_refuses_compiled_but_prices_cuda_graphs_alone(capsys):
    base = ["predict", "gpt2", "--gpu", P100, "--batch", "1", "--seq", "16"]
    assert main(base + ["--fusion", "compiled"]) == 2
    assert fusion_refusal(get_gpu(P100), "compiled") in capsys.readouterr().err
    assert main(base + ["--fusion", "compiled", "--cuda-graphs"]) == 2
    capsys.readouterr()
    assert main(base + ["--cuda-graphs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_ms"] > 0


def test_compare_shows_a_pascal_row_as_unsupported_and_only_pascal_is_one_error(capsys):
    argv = ["compare", "gpt2", "--gpus", f"v100-pcie-32gb,{P100}", "--batch", "1", "--seq", "16",
            "--fusion", "compiled", "--json"]
    assert main(argv) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["v100-pcie-32gb"]["step_ms"] > 0 and not rows["v100-pcie-32gb"]["unsupported"]
    assert rows[P100]["step_ms"] is None
    assert rows[P100]["unsupported"] == fusion_refusal(get_gpu(P100), "compiled")
    assert main(["compare", "gpt2", "--gpus", f"p4,{P100}", "--batch", "1", "--seq", "16",
                 "--fusion", "compiled"]) == 2
    assert f"none of p4, {P100} can run it" in capsys.readouterr().err


def test_generate_with_disable_compile_still_refuses_a_compiled_prefill(capsys):
    """HF not compiling (--disable-compile), --fusion compiled still asks torch.compile."""
    assert main(["predict", "gpt2", "--gpu", P100, "--mode", "generate", "--batch", "1", "--seq",
                 "16", "--new-tokens", "2", "--disable-compile", "--fusion", "compiled"]) == 2
    assert fusion_refusal(get_gpu(P100), "compiled") in capsys.readouterr().err


def test_whole_model_panel_shows_the_reason_not_a_number():
    from widgets.whole_model import WholeModelPanel

    p = WholeModelPanel(model="gpt2", gpu="v100-sxm2-16gb", mode="inference", batch=1, seq=32,
                        fusion="compiled")
    assert "failed" not in p.summary.value and "cannot show" not in p.summary.value
    p.gpu.value = P100
    assert p.summary.value.startswith("cannot show this choice:")
    assert "CUDA capability under 7.0" in p.summary.value


def test_compare_generate_with_disable_compile_shows_the_fusion_reason(capsys):
    assert main(["compare", "gpt2", "--gpus", f"v100-pcie-32gb,{P100}", "--mode", "generate",
                 "--batch", "1", "--seq", "16", "--new-tokens", "2", "--disable-compile",
                 "--fusion", "compiled", "--json"]) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["v100-pcie-32gb"]["step_ms"] > 0
    assert rows[P100]["step_ms"] is None
    assert rows[P100]["unsupported"] == fusion_refusal(get_gpu(P100), "compiled")


def test_whole_model_panel_built_for_it_is_one_kit_error():
    """As the panel's other bad constructor arguments (test_widgets_bad_input): one KitError."""
    from widgets.whole_model import WholeModelPanel

    with pytest.raises(KitError, match="CUDA capability under 7.0"):
        WholeModelPanel(model="gpt2", gpu=P100, mode="inference", batch=1, seq=32, fusion="compiled")
