"""Measured kernel data: one tidy schema (kit.data.schema), loaders, and the collector.

    load_neusight(part, data_dir=None, ops=None, gpus=None)  NeuSight's operator measurements
    load_measurements(path)          a schema CSV (the collector's) or a NeuSight-format CSV
    load_labels(data_dir=None)       NeuSight's whole-model latencies (load_label_nodes: per FX node;
                                     label_gemm_nodes: its GEMM nodes with their shapes;
                                     label_kernel_pairs: those beside the kernel data)
    load_model_configs() / load_device_configs()
"""
from kit.data.configs import (label_gemm_nodes, label_kernel_pairs, load_device_configs,
                              load_label_nodes, load_labels, load_model_configs)
from kit.data.neusight import PARTS, load_neusight, resolve_data_dir
from kit.data.loading import load_measurements
from kit.data.schema import COLUMNS, OP_CLASSES, OPS, parse_tile

__all__ = ["COLUMNS", "OPS", "OP_CLASSES", "PARTS", "label_gemm_nodes", "label_kernel_pairs",
           "load_device_configs", "load_label_nodes", "load_labels", "load_measurements", "load_model_configs", "load_neusight", "parse_tile",
           "resolve_data_dir"]
