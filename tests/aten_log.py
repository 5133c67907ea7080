"""Which aten ops torch runs on real tensors, for tests that hold the capture to torch."""
from torch.utils._python_dispatch import TorchDispatchMode


class AtenLog(TorchDispatchMode):
    """with AtenLog() as log: ... ; log.ops: the aten op names ("mm", "addmm", ...) in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))
