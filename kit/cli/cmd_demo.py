"""`kit demo`: the main job on built-in defaults — a short tour of what the kit predicts."""
from kit.cli import add_command

DEFAULT_GPU = "h100-sxm"


def run(args):
    from kit.api import predict_op
    from kit.ops import Gemm

    gpu = args.gpu
    sections = {"gemm": predict_op(Gemm(m=8192, n=8192, k=8192, dtype="bf16"), gpu)}
    sections["gemm_fp32"] = predict_op(Gemm(m=4096, n=4096, k=4096, dtype="fp32"), gpu)
    return {"gpu": gpu, **sections}


def text(r):
    from kit.cli.cmd_op import text as op_text

    parts = [f"kit demo on {r['gpu']} (every number below is a prediction; no GPU needed)", ""]
    parts += ["1. An 8192³ bf16 GEMM:", op_text(r["gemm"]), ""]
    parts += ["2. A 4096³ fp32 GEMM:", op_text(r["gemm_fp32"])]
    return "\n".join(parts)


def register(sub):
    p = add_command(sub, "demo", "a short tour of the kit's predictions on built-in defaults", run, text)
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU for the tour (default {DEFAULT_GPU})")
