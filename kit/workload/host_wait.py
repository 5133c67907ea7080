"""Host waits inside a pass: ops after which the CPU issues nothing more until the GPU has run
every kernel before them, as at generate's stop check (kit.workload.hf_generate), which ends
each step. kit.workload.iteration prices one inside a pass the same way: the ops after it start
from a drained GPU, a step split there and its parts run one after the other.

* HOST_READ, aten._local_scalar_dense (a tensor's value read on the host: bool(), int(), .item();
  generate's stop check. Not OPT's torch.ones(b, past + s), which a static cache's
  cumulative_length, a device tensor, would size (modeling_opt.py:347-354): under generate a
  static step gets the 4D mask prepare_inputs_for_generation builds (generation/utils.py:
  729-760), so that line never runs);
* H2D_COPY, a blocking copy from host memory (torch.tensor(..., device=cuda) or .to(cuda) of a
  CPU tensor, non_blocking False): PyTorch's copy_ synchronises the stream after its
  cudaMemcpyAsync unless non_blocking (at::cuda::memcpy_and_sync). A full StaticSlidingWindowLayer
  makes one each step (torch.tensor([-1]), cache_utils.py:578).

Both are free ops (no kernel): the capture records them where they run (record)."""
from __future__ import annotations

HOST_READ = "aten._local_scalar_dense.default"
H2D_COPY = "host_wait.h2d_copy"
HOST_WAITS = frozenset({HOST_READ, H2D_COPY})


def record(name: str, like) -> None:
    """Record a host wait `name` (HOST_READ or H2D_COPY) on tensor `like` where a capture is
    recording (kit.workload.recorder.Recorder is the dispatch mode in force); nothing else."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from kit.workload.recorder import Recorder

    mode = _get_current_dispatch_mode()
    if isinstance(mode, Recorder):
        mode.record_fused(name, None, "free", 0, [like], [])
