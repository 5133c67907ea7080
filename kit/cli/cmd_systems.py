"""`kit systems`: the multi-GPU system presets."""
from kit.cli import add_command


def run(args):
    from kit.hardware import get_system, list_systems

    return [get_system(name).to_dict() for name in list_systems()]


def text(systems):
    head = ["system", "nodes", "GPUs/node", "gpu", "fabric", "GB/s/dir", "NICs", "network"]
    rows = [[s["key"], str(s["nodes"]), str(s["gpus_per_node"]), s["gpu"],
             s["fabric"] + (" + NVLS" if s["nvls"] else ""), f"{s['gpu_fabric_bw_gbs']:.0f}",
             str(s["nics_per_node"]), s["network"]] for s in systems]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    return "\n".join(lines + ["multi-node: any preset as '<preset>-x<nodes>' or '<preset>-<network>-x<nodes>'; "
                              "`kit systems --json` for sources"])


def register(sub):
    add_command(sub, "systems", "list the multi-GPU system presets (fabric, NICs, network)", run, text)
