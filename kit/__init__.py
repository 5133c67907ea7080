"""gpu-perf-kit: predict how long deep-learning workloads take on GPUs, and show why."""
from kit.errors import KitError

__version__ = "0.1.0"
__all__ = ["KitError", "__version__"]
