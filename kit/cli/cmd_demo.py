"""`kit demo`: the main job on built-in defaults — a short tour of what the kit predicts."""
from kit.cli import add_command

DEFAULT_GPU = "h100-sxm"
DEFAULT_SYSTEM = "dgx-h100"


def run(args):
    from kit.api import predict_model, predict_op
    from kit.comm import predict_collective
    from kit.hardware import get_gpu, get_system
    from kit.ops import Gemm

    gpu = args.gpu
    system = get_system(args.system)  # before the seconds of predictions: an unknown one fails now
    # bf16 where the GPU has it, else fp16 (T4, V100, P100), else fp32 (P4)
    dtype = next(d for d in ("bf16", "fp16", "fp32") if get_gpu(gpu).peak_tflops(d))
    step = predict_model("gpt2", gpu, mode="train", batch=8, seq=1024, dtype=dtype)
    allreduce = predict_collective("allreduce", 1e9, system)
    return {"gpu": gpu, "system": args.system, "dtype": dtype,
            "gemm": predict_op(Gemm(m=8192, n=8192, k=8192, dtype=dtype), gpu),
            "gpt2_train_step": step.to_dict(),
            "allreduce_1gb": allreduce.to_dict()}


def text(r):
    from kit.cli.cmd_op import text as op_text
    from kit.cli.cmd_predict import text as model_text

    a = r["allreduce_1gb"]
    return "\n".join([
        f"kit demo on {r['gpu']} (every number below is a prediction; no GPU needed)", "",
        f"1. One 8192³ {r['dtype']} GEMM:", op_text(r["gemm"]), "",
        "2. A GPT-2 (124M) training step, batch 8 × 1024 tokens:", model_text(r["gpt2_train_step"]), "",
        f"3. An all-reduce of 1 GB over the {a['ranks']} GPUs of a {r['system']}: {a['time_ms']:.3f} ms via "
        f"{a['algorithm']}, busbw {a['busbw_gbs']:.0f} GB/s ({a['bound']}-bound)", "",
        "Next: `kit predict gpt3-xl --gpu a100-sxm4-80gb --mode train --batch 4 --seq 2048`, "
        "`kit predict llama3-8b --gpu h100-sxm --mode generate --dtype bf16` (time to first "
        "token, then per token), `kit compare`, `kit systems`, `make lab`."])


def register(sub):
    p = add_command(sub, "demo", "a short tour of the kit's predictions on built-in defaults", run, text)
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU for the tour (default {DEFAULT_GPU})")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help=f"system for the collective (default {DEFAULT_SYSTEM})")
    from kit.cli.cmd_predict import add_weights_option

    p.set_defaults(predictor="auto")  # the tour's learned predictions say whose weights they read
    add_weights_option(p)
