"""Where torch.compile (Inductor) cannot compile: the kit refuses to price a compiled run there.

torch 2.13's Inductor has no Triton backend on a GPU of CUDA capability under 7.0: has_triton()
asks major >= 7 (torch/utils/_triton.py:189-190) and the scheduler raises GPUTooOldForTriton
without it (torch/_inductor/scheduler.py:8492-8497, exc.py:143-155). A CUDA graph alone
(torch.cuda.graphs, the kit's --cuda-graphs with fusion eager) needs no Inductor and is not refused.
"""
from kit.errors import KitError

# the kit's GPU archs under capability 7.0 (Pascal: P100 6.0, P4/P40 6.1)
NO_INDUCTOR_ARCHS = frozenset({"pascal"})


def inductor_refusal(g, what: str, instead: str) -> str | None:
    """Why `what` (a run that compiles with Inductor) cannot run on GPU g, with what to price
    `instead`; None where Inductor compiles for g."""
    if g.arch not in NO_INDUCTOR_ARCHS:
        return None
    return (f"{g.key} ({g.arch}, CUDA capability under 7.0): {what} with Inductor, whose Triton "
            f"backend needs capability 7.0 or more, so it fails there; {instead}")


def fusion_refusal(g, fusion: str) -> str | None:
    """Why fusion cannot run on GPU g (compiled: torch.compile, on a GPU Inductor cannot compile
    for), or None where it can."""
    if fusion != "compiled":
        return None
    return inductor_refusal(g, "fusion compiled prices torch.compile, which compiles the step",
                            "price it eager (--fusion eager)")


def check_fusion_on(g, fusion: str) -> None:
    """Refuse a fusion that cannot run on GPU g (fusion_refusal)."""
    why = fusion_refusal(g, fusion)
    if why:
        raise KitError(why)
