"""Hardware: GPU datasheets (catalog) and, later, systems and topologies."""
from kit.hardware.catalog import (close_matches, get_gpu, gpu_keys, keys_of, list_gpus,
                                  load_gpu_file, register_gpu, unregister_gpu)
from kit.hardware.gpu import DTYPES, GPU, gpu_from_dict

__all__ = ["DTYPES", "GPU", "close_matches", "get_gpu", "gpu_from_dict", "gpu_keys", "keys_of", "list_gpus",
           "load_gpu_file", "register_gpu", "unregister_gpu"]
from kit.hardware.system import System, get_system, list_systems  # noqa: E402  (issue 6)

__all__ += ["System", "get_system", "list_systems"]
