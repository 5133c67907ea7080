"""One collective as a rank of kit.comm.measure runs it, through torch.distributed: the call to
time and the check of its result (the elements that differ from the expected values, as
nccl-tests validates). Sizes follow nccl-tests: all-gather and reduce-scatter counts are totals;
sendrecv is a ring shift posted as one dist.batch_isend_irecv pair.
"""
from __future__ import annotations


def collective_op(kind, count, n, rank, dev):
    """(run, validate) closures for one collective on `count` float32 elements."""
    import torch
    import torch.distributed as dist

    opts = {"dtype": torch.float32, "device": dev}
    chunk = count // n
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind in ("allreduce", "broadcast", "reduce"):
        x = torch.ones(count, **opts)
        call = {"allreduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, 0),
                "reduce": lambda: dist.reduce(x, 0)}[kind]

        def check():
            x.fill_(rank + 1)
            call()
            want = 1.0 if kind == "broadcast" else n * (n + 1) / 2
            return int((x != want).sum()) if (kind != "reduce" or rank == 0) else 0
        return call, check
    if kind == "allgather":
        x, y = torch.ones(chunk, **opts), torch.empty(count, **opts)

        def check():
            x.fill_(rank + 1)
            gather(y, x)
            want = torch.arange(1, n + 1, **opts).repeat_interleave(chunk)
            return int((y != want).sum())
        return (lambda: gather(y, x)), check
    if kind == "reducescatter":
        x, y = torch.ones(count, **opts), torch.empty(chunk, **opts)

        def check():
            x.fill_(rank + 1)
            scatter(y, x)
            return int((y != n * (n + 1) / 2).sum())
        return (lambda: scatter(y, x)), check
    if kind == "alltoall":
        x, y = torch.ones(count, **opts), torch.empty(count, **opts)

        def check():
            x.copy_((rank * n + torch.arange(n, **opts)).repeat_interleave(chunk))
            dist.all_to_all_single(y, x)
            want = (torch.arange(n, **opts) * n + rank).repeat_interleave(chunk)
            return int((y != want).sum())
        return (lambda: dist.all_to_all_single(y, x)), check
    x, y = torch.ones(count, **opts), torch.empty(count, **opts)  # sendrecv: ring shift

    def call():  # one batched pair: with two ranks both peers are the same rank, and separate
        # isend/irecv on one NCCL communicator could each wait for the other (a deadlock)
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % n), dist.P2POp(dist.irecv, y, (rank - 1) % n)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()

    def check():
        x.fill_(rank + 1)
        call()
        return int((y != (rank - 1) % n + 1).sum())
    return call, check
