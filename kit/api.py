"""The verbs every face of the kit shares (CLI, notebooks, widgets), so all give the same answer."""
from __future__ import annotations

import os

from kit.errors import KitError, comma_names, need_path, whole_number, yes_no
from kit.hardware import get_gpu, list_gpus
from kit.predict import get_predictor, roofline


def gpus_table():
    """The catalog as a DataFrame, one row per GPU."""
    import pandas as pd

    return pd.DataFrame([g.to_dict() for g in list_gpus()])


def _row_tiling(op, gpu, row, model, source: str | None = None):
    """kit.predict.row_tiling's RowTiling behind model's row for op on gpu (None: a streamed
    GEMV), searched with model's tile chooser's tiles and the training GPUs that bound it; the
    one kit op's source line names (kit.predict.op_source: "its time on the X") first, before
    gpu itself (an A100-PCIe-80GB's tiles and waves are its 40GB sibling's)."""
    from kit.predict.row_tiling import row_tiling
    from kit.predict.sibling_bound import bounding_gpus

    vocab = list(getattr(getattr(model, "chooser", None), "vocab", ()))
    others = bounding_gpus(model, gpu)
    named = [g for g in others if str(source).startswith(f"its time on the {g.key},")]
    # the op's own tiling is checked against its own time only where a twin's bound may have set
    # it: predict_op's source line says so (kit.predict.op_source); op_tiling has none
    twin_set = source is None or str(source).startswith(("the time of a twin", "its time on the"))
    return row_tiling(op, gpu, row, vocab, others, first=named[0] if named else None,
                      times_of=_times_of(model), verify_own=twin_set)


def _times_of(model):
    """For row_tiling: twins' frame on a GPU with no other twin's bound (as_twins: no padding
    ladder; _raw_doubled: no row bound) nor a training GPU's, whose time and tile a bound copies
    into the row of the op it sets; None for a predictor without GEMM bounds."""
    if not hasattr(model, "as_twins"):
        return None

    def times_of(twins, where):
        with model.as_twins():
            model._raw_doubled = True  # as_twins puts the caller's value back
            return model.predict_unbounded(twins, where)
    return times_of


def _need_op(op, verb: str) -> None:
    """A KitError unless op is a kit.ops op (kit.predict.base.is_op, as every predictor asks)."""
    from kit.predict.base import is_op

    if not is_op(op):
        raise KitError(f"{verb} needs a kit.ops op (Gemm, Elementwise, Softmax, ...), got {op!r}")


def _path_arg(value, what: str):
    """value as given, once it is a path: a non-empty string or an os.PathLike."""
    return need_path(value, what)


def op_tiling(op, gpu, predictor: str = "auto"):
    """The Tiling (tiles, occupancy, waves) of the tile the predictor says the op runs with;
    None where it has none (a GEMV the predictor streams, kit.predict.gemv)."""
    _need_op(op, "op_tiling")
    _refuse_fp8_row_op(op)
    gpu = get_gpu(gpu)
    model = get_predictor(predictor)
    rt = _row_tiling(op, gpu, model.predict([op], gpu).iloc[0], model)
    return None if rt is None else rt.tiling


def memory_problem(op, gpu) -> str | None:
    """Why op cannot run on gpu for want of memory (its operands alone exceed it), or None."""
    _need_op(op, "memory_problem")
    gpu = get_gpu(gpu)
    table = getattr(op, "table_bytes", 0.0)  # an embedding table is resident, not only what is read
    if table > gpu.usable_memory_bytes:  # a T4 holds 15 of its 16 GiB with ECC on
        return (f"{op.op_class} table of {table / 2**30:.4g} GiB is larger than {gpu.key}'s "
                f"{gpu.memory_text()} of memory: shard it (`kit shard`) or give fewer rows")
    moved = op.bytes * _fill_share(op)  # a fill writes its output alone
    if moved <= gpu.usable_memory_bytes:
        return None
    return (f"{op.op_class} moves {moved / 2**30:.4g} GiB of operands, more than "
            f"{gpu.key}'s {gpu.memory_text()} of memory: no such kernel can run on it")


def _refuse_fp8_row_op(op) -> None:
    """KitError for an fp8 softmax, layernorm, rmsnorm or dropout: torch has no such kernel (its
    CPU and CUDA kernels dispatch fp32, fp64, fp16 and bf16 only: torch 2.13 raises
    '"LayerNormKernelImpl" not implemented for 'Float8_e4m3fn'', and likewise softmax, rms_norm
    and dropout's bernoulli) and no kit collector measured one, yet `kit op layernorm --dtype fp8`
    had priced one, even on an A100, which has no fp8 at all (0.04813 ms for 4096x4096) while
    `kit op gemm --dtype fp8` there was refused. fp8 stays for GEMMs (torch._scaled_mm) and for
    elementwise ops and embedding bags (one-byte data: uint8, bool, casts, quantized tables)."""
    from kit.ops import Dropout, LayerNorm, RMSNorm, Softmax

    if isinstance(op, (Softmax, LayerNorm, RMSNorm, Dropout)) and op.dtype == "fp8":
        raise KitError(f"{op.op_class} has no fp8 kernel in torch (its kernels take fp32, fp16 and "
                       "bf16); an fp8 model runs it in bf16 or fp16: price that dtype instead")


def _fill_share(op) -> float:
    """1, or for a fill (which reads nothing) the share of the learned one-input pass it moves."""
    from kit.ops import Elementwise

    if isinstance(op, Elementwise) and op.kind == "fill":
        from kit.workload.mapping_elementwise import pass_share

        return pass_share(0, op.n_inputs)
    return 1.0


def predict_op(op, gpu, predictor: str = "auto") -> dict:
    """Predict one op on one GPU and say why: roofline, tiling, waves, bound, utilisation."""
    _need_op(op, "predict_op")
    _refuse_fp8_row_op(op)
    gpu = get_gpu(gpu)
    problem = memory_problem(op, gpu)
    if problem:
        raise KitError(problem)
    model = get_predictor(predictor)
    row = model.predict([op], gpu).iloc[0]
    roof = roofline(op, gpu)
    share = _fill_share(op)
    if share != 1.0:  # a fill writes its output alone: as kit predict costs it
        from kit.workload.kernels import Derived

        row = row.copy()
        for col in ("latency_ms", "latency_p10_ms", "latency_p90_ms"):
            row[col] = float(row[col]) * share
        roof = roofline(Derived("elementwise", (op,), share), gpu)
    out = {
        "op": op.op_class,
        "gpu": gpu.key,
        "dtype": getattr(op, "dtype", None),
        "predictor": model.name,
        "latency_ms": float(row.latency_ms),
        "latency_p10_ms": float(row.latency_p10_ms),
        "latency_p90_ms": float(row.latency_p90_ms),
        "roofline_ms": roof.time_ms,
        "compute_ms": roof.compute_ms,
        "memory_ms": roof.memory_ms,
        "bound": roof.bound,
        "intensity_flops_per_byte": roof.intensity_flops_per_byte,
        "ridge_flops_per_byte": roof.ridge_flops_per_byte,
        "utilisation": float(row.utilisation),
        "flops": op.flops,
        "bytes": op.bytes * share,
        "tile": str(row.tile),
        "tiles": int(row.tiles),
        "waves": int(row.waves),
        "split_k": int(getattr(row, "split_k", 1) or 1),
    }
    import numpy as np

    from kit.ops import DTYPE_BYTES
    from kit.predict.features import op_class_of
    from kit.predict.row_reread import reread_bytes

    cls = op_class_of(op)
    if cls in ("softmax", "layernorm"):  # DRAM bytes of the row re-reads that spill the caches
        out["reread_bytes"] = float(reread_bytes(cls, np.array([op.rows]), np.array([op.cols]),
                                                 gpu, DTYPE_BYTES[op.dtype])[0])
    if model.name == "tile":
        from kit.predict.op_source import tile_source

        tile_source(model, op, gpu, out, cls)
    rt = _row_tiling(op, gpu, row, model, out.get("source", ""))
    t = None if rt is None else rt.tiling
    if t is not None:
        out.update(tile_dims=list(t.tile_dims), blocks_per_sm=t.blocks_per_sm, occupancy_limiter=t.limiter, slots=t.slots,
                   last_wave_fill=t.last_wave_fill, threads_per_block=t.threads_per_block)
        if not rt.own:  # a bound set the time: the tiles are its twin's, or another GPU's
            out["tiled_as"] = {"m": rt.op.m, "n": rt.op.n, "k": rt.op.k, "b": rt.op.b, "gpu": rt.gpu.key}
    if share != 1.0:
        out["fill_note"] = (f"a fill reads nothing: {share:g} of the {op.n_inputs}-input pass the "
                            "predictor prices, its output's bytes alone (kit predict costs a fill "
                            "so: kit.workload.mapping_elementwise.pass_share)")
    if model.name in ("mlp", "li"):  # a class it has no model of takes its fallback: say so
        from kit.predict import bundle_in_use
        from kit.predict.evaluate import FALLBACK, learned_classes

        learned = learned_classes(model.name, bundle_in_use())
        if cls not in learned:
            out["source"] = (f"the {FALLBACK[model.name]}: the {model.name} predictor has no model "
                             f"of {cls} (it learned {', '.join(sorted(learned))}); --predictor tile "
                             "gives it a learned price")
    if model.name == "tile":
        from kit.predict.op_source import tile_choice

        if cls == "gemm" and out["tile"] != "gemv" and not str(out.get("source", "")).startswith(
                "kit.predict.tensor_core"):
            out["tile_choice"] = tile_choice(model, op, gpu, out["split_k"])
    return out


def shard_tables(tables, system, batch: int = 512, optimizer: str = "rowwise_adagrad",
                 memory_gib: float | None = None, nodes: int | None = None,
                 time_budget_s: float = 2.0, kinds=None, max_plans: int | None = None) -> dict:
    """Plan embedding-table sharding: tables is a CSV path or a list of kit.embedding.Table.
    max_plans: the plans the search may price (None: time_budget_s at
    kit.sharding.search.PLANS_PER_S); the time budget caps its wall clock either way."""
    from kit.hardware.system import get_system
    from kit.sharding import KINDS, as_tables, plan_sharding

    tables = as_tables(tables)
    if memory_gib is not None and (isinstance(memory_gib, bool)
                                   or not isinstance(memory_gib, (int, float)) or not memory_gib > 0):
        raise KitError(f"memory_gib must be a positive number of GiB (or None), got {memory_gib!r}")
    if isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float)) \
            or not 0 < time_budget_s < float("inf"):  # as the CLI's --budget-s: no search is no plan
        raise KitError(f"time budget must be a positive number of seconds, got {time_budget_s!r}")
    if kinds is not None and not isinstance(kinds, str) and not (
            isinstance(kinds, (list, tuple)) and all(isinstance(k, str) for k in kinds)):
        raise KitError(f"kinds must be names (\"rw,dp\" or a list of them), got {kinds!r}")
    sysobj = get_system(system, nodes=nodes) if nodes is not None else get_system(system)
    if isinstance(kinds, str):  # "rw,dp" as the CLI takes it, not the letters of "rw"
        text, kinds = kinds, comma_names(kinds, "--kinds")
        if not kinds:
            raise KitError(f"--kinds is empty ({text!r}); name some of {', '.join(KINDS)}")
    return plan_sharding(tables, sysobj, batch=batch, optimizer=optimizer, memory_cap_gib=memory_gib,
                         kinds=tuple(kinds) if kinds is not None else KINDS, time_budget_s=time_budget_s,
                         max_plans=max_plans)


def predict_model(model, gpu, mode: str = "train", batch: int | None = None, seq: int | None = None,
                  dtype: str = "fp32", fusion: str = "eager", optimizer: str | None = None,
                  predictor: str = "auto", overhead=None, inputs=None, kv_cache: str = "static",
                  loss: bool = True):
    """Predict one training step or inference pass of a whole model on one GPU.

    model: a zoo name, an HF-style config dict, a "module:callable" path or an nn.Module
    (with `inputs`, a tuple or dict of example tensors, when it does not take input_ids).
    batch: default 1; none may be given where the inputs (`inputs`, or a callable's
    (module, inputs)) fix it.
    loss: a language model's training step includes the cross-entropy over the vocabulary
    (False: backward from the logits, as NeuSight's labels; kit validate).
    Returns a kit.workload.iteration.Iteration (total_ms, phases_ms, by_class(), top_kernels(),
    timeline, to_trace(), to_dict()).
    """
    from kit.workload.fusion import check_fusion
    from kit.workload.inductor import check_fusion_on
    from kit.workload.iteration import iteration
    from kit.workload.models import graph_of, memory_fit, refuse_loss_left_out_of_none

    check_fusion(fusion)  # before the capture; iteration() memoises on it as a dict key
    check_fusion_on(get_gpu(gpu), fusion)  # torch.compile on a GPU Inductor cannot compile for
    loss = yes_no(loss, "loss")
    if loss is not True and mode != "train":  # as the CLI's --no-loss: it would change nothing
        raise KitError(f"loss={loss!r} goes with mode 'train' (got mode {mode!r}): only a training "
                       "step has a loss to leave out")
    graph = graph_of(model, batch, seq, mode, dtype, optimizer, inputs, kv_cache, loss)
    refuse_loss_left_out_of_none(graph, model, loss)
    it = iteration(graph, gpu, predictor=predictor, fusion=fusion, overhead=overhead)
    it.meta["memory"] = memory_fit(it, gpu)  # a step that would not fit says so (it.fits)
    return it


def predict_generation(model, gpu, batch: int = 1, prompt: int = 512, new_tokens: int = 128,
                       dtype: str = "fp32", fusion: str = "eager", predictor: str = "auto",
                       overhead=None, kv_cache: str = "static", disable_compile: bool = False) -> dict:
    """Predict generating `new_tokens` per sequence after a `prompt`-token prefill on one GPU:
    time to first token, time per output token, total and tokens/s, with the KV cache in the
    memory need (kit.workload.generation). Over a static cache the decode steps are priced
    compiled under CUDA graphs, as HF 5.25's generate runs them by default; disable_compile=True
    (HF's flag) prices them as fusion and overhead ask. "priced" says how each pass was."""
    from kit.workload.generation import generation

    return generation(model, gpu, batch=batch, prompt=prompt, new_tokens=new_tokens, dtype=dtype,
                      fusion=fusion, predictor=predictor, overhead=overhead, kv_cache=kv_cache,
                      disable_compile=disable_compile)


def predict_multi_gpu(model, system, nodes: int | None = None, predictor: str = "auto",
                      profile: str = "default", graph="auto", seq: int | None = None, **layout) -> dict:
    """Predict one training iteration of a GPT-style model on a parallel layout of a System:
    iteration_ms, the critical-path breakdown and memory per rank. layout: kit.parallel.Layout
    fields (dp, tp, pp, ep, micro_batch, global_batch, virtual_stages, zero, recompute, dtype, ...);
    dtype defaults to fp32, as `kit predict --system` and predict_model (Layout's own default,
    fp16, had made the same call 4x faster here than on the command line). seq: the sequence
    length of a zoo name, inline shape or config file (as --seq). graph: True shards the model's
    captured op graph, False uses the analytic GPT layer, "auto" the graph for zoo models (see
    kit.parallel.predict_parallel)."""
    from dataclasses import fields

    from kit.parallel import Layout, parse_model, predict_parallel
    from kit.parallel.profiles import get_profile

    known = [f.name for f in fields(Layout) if f.init]
    unknown = sorted(set(layout) - set(known))
    if unknown:
        raise KitError(f"predict_multi_gpu: unknown layout field(s) {', '.join(unknown)}; "
                       f"valid: {', '.join(known)} (and seq)")
    if seq is not None:
        if not isinstance(model, str):
            raise KitError("predict_multi_gpu: seq goes with a model name, inline shape or config file; "
                           "a GPTSpec carries its own seq")
        from kit.workload.zoo_checks import _check_positive

        _check_positive(seq=seq)
        model = parse_model(model, seq=seq)
    layout.setdefault("dtype", "fp32")
    return predict_parallel(model, system, Layout(**layout), nodes=nodes, predictor=predictor,
                            host=get_profile(profile), graph=graph)


def replay_trace(trace, on=None, et=None, source=None) -> dict:
    """Replay a Kineto trace (file, .gz, folder or tarball): per-rank measured vs replayed step
    and the critical path; with `on` (a GPU or system) predict the same step there. et: PyTorch
    execution traces to link (None: those found with the trace; False: none). source: with `on`
    a system, the preset system the trace was recorded on (the CLI's --from; None: the first
    single-node preset of its GPU that fits, named in the result's source_system)."""
    from kit.trace import replay

    _path_arg(trace, "trace")
    if et is not None and et is not False:
        for e in (et if isinstance(et, (list, tuple)) else [et]):
            _path_arg(e, "et (an execution trace; None: those found, False: none)")
    return replay(trace, on=on, et=et, source=source).to_dict()


def train_predictors(train_gpus, out, data_dir=None, seed: int = 0, threads: int | None = None,
                     quick: bool = False, direct: bool = True, progress: bool = False,
                     command: str | None = None, test_rows: bool = True, extra=None,
                     replace_shipped: bool = False, suspect_rows: bool = False) -> dict:
    """Fit the learned predictors (tile-MLP, tile chooser, Li, direct MLP) on NeuSight's
    measurements of train_gpus and write the weights + manifest to `out` (threads: torch threads,
    default two or the cores if fewer; at most the cores). test_rows: also the
    softmax and layer-norm rows of NeuSight's test files for those GPUs
    (kit.predict.training.training_frame); the manifest counts them (test_rows_trained_on).
    extra: paths of one's own measurements (the kit's collector CSVs or folders of them) whose
    FP32 rows join the training data (kit.predict.own_measurements); the manifest lists each
    file with its sha256 and rows (extra_data). replace_shipped: `out` may be the shipped weights
    folder (kit/predict/weights), which is refused otherwise. suspect_rows: keep the measured rows
    kit.predict.training.SUSPECT_ROWS leaves out (the manifest lists those left out,
    suspect_rows_left_out)."""
    from kit.data import resolve_data_dir
    from kit.data.fetch import NEUSIGHT_COMMIT
    from kit.predict.training import (QUICK, default_threads, parse_gpu_list, train_bundle,
                                      training_frame)
    from kit.predict.weights import check_weights_folder, save_bundle

    if isinstance(train_gpus, str):
        gpus = parse_gpu_list(train_gpus)
    elif isinstance(train_gpus, (list, tuple)) and all(isinstance(g, str) for g in train_gpus):
        gpus = parse_gpu_list(",".join(train_gpus))
    else:
        raise KitError(f"train_gpus must be GPU names (\"P4,T4\" or a list of them), got {train_gpus!r}")
    _path_arg(out, "out (the weights folder)")
    seed = whole_number(seed, "seed", 0)
    threads = default_threads() if threads is None else whole_number(threads, "threads", 1)
    cores = os.cpu_count() or 1
    if threads > cores:  # torch would oversubscribe the cores: far slower, never faster
        raise KitError(f"threads {threads} is more than this machine's {cores} cores")
    test_rows, quick, direct, progress, replace_shipped, suspect_rows = (
        yes_no(flag, name) for name, flag in (("test_rows", test_rows), ("quick", quick),
                                              ("direct", direct), ("progress", progress),
                                              ("replace_shipped", replace_shipped),
                                              ("suspect_rows", suspect_rows)))
    if not 0 <= seed < 2**63:
        raise KitError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed}")
    if isinstance(extra, (str, os.PathLike)):
        extra = [extra]
    if extra is not None and not (isinstance(extra, (list, tuple))
                                  and all(isinstance(e, (str, os.PathLike)) for e in extra)):
        raise KitError(f"extra must be paths of measurement CSVs or folders, got {extra!r}")
    extra = list(extra or [])
    check_weights_folder(out, replace_shipped)  # before minutes of training, not after
    data = resolve_data_dir(data_dir)
    extra_files = []
    if extra:
        from kit.predict.own_measurements import own_rows
        from kit.predict.training import MODELLED

        _, extra_files = own_rows(extra, MODELLED)
    frame = training_frame(data, gpus, test_rows=test_rows, extra=extra, suspect_rows=suspect_rows)
    n_test = int((frame.split == "test").sum())  # 0 when the data has no test files
    kept = frame.attrs.get("extra_rows_kept", {})
    for f in extra_files:  # the rows trained on: a shape NeuSight (or the file) already has keeps one row
        if "rows" in f:
            f["rows_trained_on"] = kept.get(f["path"], 0)
            f["left_out"]["shape already measured"] = f["rows"] - f["rows_trained_on"]
    left_out = frame.attrs.get("suspect_rows_left_out", [])
    bundle = train_bundle(frame, gpus, seed=seed, threads=threads,
                          settings=QUICK if quick else None, direct=direct, calibrate=not quick,
                          progress=progress,
                          info={"data_source": "NeuSight measurements, github.com/sitar-lab/"
                                               f"NeuSight@{NEUSIGHT_COMMIT[:10]} scripts/asplos "
                                               "(kit.data parts train-collect + train"
                                               + (f", and {n_test} softmax and layer-norm rows "
                                                  "of part test of the GPUs trained on)"
                                                  if n_test else ")")
                                + "".join(f"; less {d['rows']} {d['gpu']} {d['op']} rows of "
                                          f"{d['source']} (suspect_rows_left_out)" for d in left_out)
                                + (f"; and {sum(f.get('rows_trained_on', 0) for f in extra_files)} FP32 rows of the "
                                   f"user's own measurements in {sum('rows' in f for f in extra_files)} "
                                   "file(s) (extra_data)"
                                   if extra_files else ""),
                                "data_dir": os.path.realpath(data),
                                "test_rows_trained_on": n_test, "extra_data": extra_files,
                                "suspect_rows_left_out": left_out, "suspect_rows_kept": suspect_rows,
                                "command": command or "kit.api.train_predictors"})
    path = save_bundle(bundle, out, replace_shipped)
    return {"out": str(path), "train_gpus": bundle.train_gpus, "rows": bundle.manifest["rows"],
            "seed": seed, "training_seconds": bundle.manifest["training_seconds"],
            "transfer_sigma": bundle.tile.transfer_sigma}


def evaluate_predictors(test, predictors=None, weights=None, data_dir=None,
                        target: str = "latency") -> list[dict]:
    """Score predictors on measured test rows (a NeuSight-format or kit CSV, or a folder):
    [{predictor, gpu, op, n, mape, median_ape, p90_ape}] in percent. target: "latency" (the
    timed call) or "kernel" (the summed kernel time the kit's collector records, kernel_ms)."""
    import pandas as pd

    from kit.predict.evaluate import VISIBLE, evaluate, parse_predictors

    if predictors is not None and not (isinstance(predictors, str) or (
            isinstance(predictors, (list, tuple)) and all(isinstance(p, str) for p in predictors))):
        raise KitError(f"predictors must be names (\"tile,roofline\" or a list), got {predictors!r}")
    parse_predictors(predictors if isinstance(predictors, str) or predictors is None
                     else ",".join(predictors))  # unknown or no names: before reading the rows
    if isinstance(test, pd.DataFrame):
        missing = [c for c in (*VISIBLE, "latency_ms") if c not in test.columns]
        if missing:
            raise KitError(f"test frame lacks the columns {', '.join(missing)} (a kit.data "
                           "measurement table; or give a CSV path)")
    else:
        _path_arg(test, "test (a CSV or a folder of them)")
    if weights is not None:
        _path_arg(weights, "weights (a folder from train_predictors)")
    return evaluate(test, predictors, weights_dir=weights, data_dir=data_dir, target=target)
