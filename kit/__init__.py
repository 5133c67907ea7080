"""gpu-perf-kit: predict how long deep-learning workloads take on GPUs, and show why."""
import time

from kit.errors import KitError

IMPORTED_NS = time.time_ns()  # kit.source_digest.process_stamp: a file written after it is not the code imported

__version__ = "0.1.0"
__all__ = ["KitError", "__version__"]
