"""`kit compare MODEL --gpus A,B,C`: which GPU to buy or rent for a model.

One row per GPU: step time, throughput (tokens/s for sequence models, samples/s otherwise),
whether weights + gradients + optimizer state + activations fit in the GPU's memory, energy per
step at TDP (an upper bound: TDP × step time), and, where the user gives prices per GPU-hour, the
cost per million tokens (or samples). No prices are built in.
"""
import math
import numbers

from kit.cli import add_command
from kit.cli.cmd_predict import (add_model_args, buffers_text, check_decode_args, dtype_text, host_lines,
                                 optimizer_text, overhead_from, pricing_text, with_calibration)
from kit.cli.outputs import nonempty


MAX_PRICE = 1000.0  # dollars per GPU-hour: far above any rental; more is a typo


def _items(text: str, flag: str) -> list[str]:
    """A comma list with no empty items (",," is a mistake, not nothing); a trailing comma is
    allowed, as it always was."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 1 and parts[-1] == "":
        parts = parts[:-1]
    if not text.strip() or "" in parts:
        from kit.errors import KitError

        raise KitError(f"{flag} {text!r} has an empty item; separate names with single commas")
    return parts


def parse_gpus(text: str) -> list[str]:
    """--gpus: GPU names, each GPU once (an alias of one already named is a duplicate)."""
    from kit.errors import KitError
    from kit.hardware import get_gpu

    seen: dict = {}
    for name in _items(text, "--gpus"):
        key = get_gpu(name).key
        if key in seen:
            raise KitError(f"--gpus names {key} twice ({seen[key]!r} and {name!r}); give each GPU once")
        seen[key] = name
    return list(seen.values())


def parse_prices(text: str | None) -> dict:
    from kit.errors import KitError
    from kit.hardware import get_gpu

    prices, named = {}, {}
    for part in _items(text, "--price-per-hour") if text is not None else []:
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise KitError(f"--price-per-hour entry {part!r} must look like GPU=DOLLARS, e.g. h100-sxm=2.5")
        try:
            price = float(value) + 0.0  # -0 is 0: a cost of -0.000 reads as a credit
        except ValueError:
            raise KitError(f"--price-per-hour entry {part!r}: {value.strip()!r} is not a number of dollars; "
                           "write GPU=DOLLARS, e.g. h100-sxm=2.5") from None
        _in_range(price, f"--price-per-hour entry {part!r}")
        key = get_gpu(name.strip()).key
        if key in prices:
            raise KitError(f"--price-per-hour prices {key} twice ({named[key]!r} and {part!r}); give one price")
        prices[key], named[key] = price, part
    return prices


def _in_range(price: float, where: str) -> None:
    from kit.errors import KitError

    if not 0 <= price <= MAX_PRICE:  # also NaN and inf; 0: a GPU already owned
        raise KitError(f"{where}: the price must be a number of dollars per GPU-hour from 0 to {MAX_PRICE:g}")


def check_prices(prices: dict, chosen) -> dict:
    """compare's prices ({GPU name: dollars per GPU-hour}) keyed by catalog key and checked as
    --price-per-hour is, before any prediction. From Python they had gone in unchecked: -2 gave
    a cost of -0.145 $/M tokens, NaN and inf a NaN and inf cost, "2" a TypeError, True a price of
    1; a name the GPU list resolves ({"h100": 2} beside "h100-sxm") was refused as "prices given
    for GPUs not compared: h100"; and in the non-generate modes that check came after every GPU
    had been predicted."""
    from kit.errors import KitError
    from kit.hardware import get_gpu

    if not isinstance(prices, dict):
        raise KitError(f"prices must be a dict of GPU name to dollars per GPU-hour, got {type(prices).__name__}")
    keyed, named = {}, {}
    own = {g.key for g in chosen}
    for name, value in prices.items():
        where = f"price for {name!r} ({value!r})"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise KitError(f"{where}: a price must be a number of dollars per GPU-hour, e.g. {{'h100-sxm': 2.5}}")
        _in_range(float(value), where)
        # a compared GPU object's own key first: one built with dataclasses.replace and a new key
        # ('my-h100') is in no catalog, so get_gpu refused the price as "unknown GPU 'my-h100'"
        key = name if isinstance(name, str) and name in own else get_gpu(name).key
        if key in keyed:
            raise KitError(f"prices name {key} twice ({named[key]!r} and {name!r}); give one price")
        keyed[key], named[key] = float(value) + 0.0, name  # -0 is 0, as on the command line
    unknown = sorted(set(keyed) - own)
    if unknown:
        raise KitError(f"prices given for GPUs not compared: {', '.join(named[k] for k in unknown)}")
    return keyed


def compare(model, gpus, mode="train", batch=None, seq=None, dtype="fp32", fusion="eager",
            optimizer=None, predictor="auto", prices=None, overhead=None,
            new_tokens: int | None = None, kv_cache: str = "static", loss: bool = True,
            disable_compile: bool = False) -> dict:
    from kit.errors import KitError
    from kit.hardware import get_gpu
    from kit.workload.inductor import fusion_refusal
    from kit.workload.iteration import iteration
    from kit.workload.models import graph_of, max_batch, memory_bytes, refuse_loss_left_out_of_none

    if isinstance(gpus, str):  # "h100-sxm,t4", as --gpus: by letter it read as unknown GPU 'h'
        gpus = parse_gpus(gpus)
    if not gpus:
        raise KitError("--gpus needs at least one GPU")
    chosen = list({get_gpu(name).key: get_gpu(name) for name in gpus}.values())  # aliases: one row
    prices = check_prices(prices or {}, chosen)
    if mode == "generate":
        return compare_generation(model, chosen, 1 if batch is None else batch, seq or 512, new_tokens or 128, dtype,
                                  fusion, predictor, prices, overhead, kv_cache, disable_compile)
    graph = graph_of(model, batch, seq, mode, dtype, optimizer, kv_cache=kv_cache, loss=loss)
    refuse_loss_left_out_of_none(graph, model, loss)
    mem = memory_bytes(graph)
    held = graph.meta.get("model_dtypes") if dtype == "model" else None
    if held is not None:  # the module's own dtypes: a GPU runs them all, the main one first
        dtype = graph.meta.get("dtype", "fp32")
    needed = list(dict.fromkeys([dtype, *(_priced_as(d) for d in held or ())]))
    # a module with its own example inputs knows its batch, and no sequence; DLRM reads none
    seq_used = graph.meta.get("seq")
    batch = graph.meta.get("batch") or batch or 1
    config = graph.meta.get("config") or {}
    per_token = seq_used is not None and config.get("model_type") != "dlrm"
    decode = graph.meta.get("mode") == "decode"  # one new token per sequence and step
    per_token = per_token or decode
    items = batch * (seq_used if per_token and not decode else 1)
    unit = "tokens" if per_token else "samples"
    rows = []
    for gpu in chosen:
        lacking = next((d for d in needed if gpu.peak_tflops(d) is None), None)
        if lacking is not None:  # a row that says so; the other GPUs still compare
            rows.append(unsupported_row(gpu, lacking, unit, mem, prices))
            continue
        why = fusion_refusal(gpu, fusion)
        if why:  # torch.compile on a GPU Inductor cannot compile for (kit.workload.inductor)
            rows.append(unsupported_row(gpu, dtype, unit, mem, prices, why))
            continue
        it = iteration(graph, gpu, predictor=predictor, fusion=fusion, overhead=overhead)
        row = gpu_row(gpu, it.total_ms, [it.total_p10_ms, it.total_p90_ms], items, unit, mem,
                      prices, it.predictor)
        row["carried_share"] = it.carried_share  # on curves carried to it (kit.workload.carried)
        if decode:  # sequences that fit beside the weights at this context
            row["max_batch"] = max_batch(mem, batch, gpu.usable_memory_bytes)
        rows.append(row)
    if all(r["unsupported"] for r in rows):
        cannot = "can run it" if any(fusion_refusal(g, fusion) for g in chosen) else f"supports {' and '.join(needed)}"
        raise KitError(f"none of {', '.join(r['gpu'] for r in rows)} {cannot}: "
                       + "; ".join(r["unsupported"] for r in rows))
    return {"model": graph.model, "mode": mode, "batch": batch,
            "seq": seq_used if per_token else None, "dtype": dtype,  # DLRM has no sequence
            **({"model_dtypes": held} if held is not None else {}),
            "context": seq_used if decode else None, "loss": graph.meta.get("loss"),
            "unit": unit, "memory": mem, "rows": rows}


def compare_generation(model, chosen, batch, prompt, new_tokens, dtype, fusion, predictor, prices,
                       overhead, kv_cache="static", disable_compile=False) -> dict:
    """compare for mode generate: a row's step is the whole generation (kit.workload.generation),
    its throughput the batch's new tokens over it, with TTFT and TPOT beside. chosen and prices
    come as compare resolved and checked them (GPU objects, one per key; check_prices's)."""
    from kit.errors import KitError
    from kit.workload.generation import compile_refusal, generation, hf_auto_compiles
    from kit.workload.inductor import fusion_refusal
    from kit.workload.models import max_batch

    asked, dtype = dtype, "fp32" if dtype == "model" else dtype  # a zoo decoder or config: fp32
    compiled = hf_auto_compiles(kv_cache, disable_compile)
    # a GPU that lacks the dtype, or (HF compiling the decode steps) that Inductor cannot compile
    # for, gets an unsupported row with its reason: one Pascal card had refused the whole table
    cannot = {g.key: no_dtype(g, dtype) if g.peak_tflops(dtype) is None else
              (compile_refusal(g) if compiled else None) or fusion_refusal(g, fusion) for g in chosen}
    if all(g.peak_tflops(dtype) is None for g in chosen):
        raise KitError(f"none of {', '.join(g.key for g in chosen)} supports {dtype}: "
                       + "; ".join(no_dtype(g, dtype) for g in chosen))
    if all(cannot.values()):
        raise KitError(f"none of {', '.join(g.key for g in chosen)} can run it: " + "; ".join(cannot.values()))
    runs = {g.key: generation(model, g, batch=batch, prompt=prompt, new_tokens=new_tokens,
                              dtype=asked, fusion=fusion, predictor=predictor, overhead=overhead,
                              kv_cache=kv_cache, disable_compile=disable_compile)
            for g in chosen if not cannot[g.key]}
    first = next(iter(runs.values()))
    # the need alone: a generation's memory also holds its own GPU's size and fit, which at the
    # top of a comparison read as the whole table's (t4 first: "gpu_memory_bytes" 16 GiB and
    # "fits" beside an h100-sxm row); each row says its own, as in the other modes
    mem = {k: v for k, v in first["memory"].items() if k not in ("gpu_memory_bytes", "gpu_usable_memory_bytes", "fits")}
    items = batch * new_tokens
    rows = []
    for gpu in chosen:
        r = runs.get(gpu.key)
        if r is None:
            rows.append(unsupported_row(gpu, dtype, "tokens", mem, prices, cannot[gpu.key]))
            continue
        band = [r["ttft_band_ms"][i] + r["decode_band_ms"][i] for i in (0, 1)]
        rows.append({**gpu_row(gpu, r["total_ms"], band, items, "tokens", mem, prices, r["predictor"]),
                     "ttft_ms": r["ttft_ms"], "tpot_ms": r["tpot_ms"],
                     "max_batch": max_batch(mem, batch, gpu.usable_memory_bytes)})
    return {"model": first["model"], "mode": "generate", "batch": batch, "seq": prompt,
            "dtype": first["dtype"],
            **({"model_dtypes": first["model_dtypes"]} if "model_dtypes" in first else {}),
            "prompt": prompt, "new_tokens": new_tokens, "context": None,
            "disable_compile": first["disable_compile"], "priced": first["priced"],
            "notes": first["notes"],
            "unit": "tokens", "memory": mem, "rows": rows}


def gpu_row(gpu, step_ms: float, band_ms, items: float, unit: str, mem: dict, prices: dict,
            predictor: str) -> dict:
    """One GPU's row: a step of `items` tokens or samples in step_ms, its memory need against the
    GPU's, energy at TDP and, where a price is given, the cost per million items."""
    step_s = step_ms / 1e3
    fits = mem["total_bytes"] <= gpu.usable_memory_bytes  # a T4 with its ECC on: 15 of 16 GiB
    # a step that does not fit has a time (what it would take) but no price: it cannot be bought
    cost = prices[gpu.key] / 3600 * step_s / items * 1e6 if gpu.key in prices and fits else None
    return {"gpu": gpu.key, "step_ms": step_ms, "band_ms": list(band_ms),
            f"{unit}_per_s": items / step_s, "memory_need_gib": mem["total_bytes"] / 2**30,
            "memory_gib": gpu.memory_gib,
            "usable_memory_gib": gpu.usable_memory_gib, "fits": fits,
            "energy_j_per_step": gpu.tdp_w * step_s, "tdp_w": gpu.tdp_w,
            f"energy_j_per_m_{unit}": gpu.tdp_w * step_s / items * 1e6,
            "price_per_hour": prices.get(gpu.key), f"cost_per_m_{unit}": cost,
            "predictor": predictor, "carried_share": None, "unsupported": None}


def _priced_as(dtype: str) -> str:
    """The kit dtype a module's parameter dtype is priced in (float64: as fp32, 8 bytes each)."""
    return dtype if dtype in ("fp32", "fp16", "bf16") else "fp32"


def no_dtype(gpu, dtype: str) -> str:
    """Why a GPU cannot run a dtype, naming the ones it can."""
    return f"{gpu.key} has no {dtype} support (it has {', '.join(gpu.dtypes)})"


def unsupported_row(gpu, dtype: str, unit: str, mem: dict, prices: dict, why: str | None = None) -> dict:
    """A GPU that cannot run the dtype (or, why given, cannot run it for that reason): no time,
    throughput, energy or cost, and the reason.
    fits is null too (the text table's "-"): the memory need is the dtype's, which this GPU
    cannot run at all, so "fits: true" beside "unsupported" read as if it could."""
    return {"gpu": gpu.key, "step_ms": None, "band_ms": None, f"{unit}_per_s": None,
            "memory_need_gib": mem["total_bytes"] / 2**30, "memory_gib": gpu.memory_gib,
            "usable_memory_gib": gpu.usable_memory_gib, "fits": None, "energy_j_per_step": None,
            "tdp_w": gpu.tdp_w, f"energy_j_per_m_{unit}": None,
            "price_per_hour": prices.get(gpu.key), f"cost_per_m_{unit}": None, "predictor": None,
            "carried_share": None, "unsupported": why or no_dtype(gpu, dtype)}


def run(args):
    from kit.hardware import load_gpu_file

    if args.gpu_file:
        load_gpu_file(args.gpu_file)
    gpus = parse_gpus(args.gpus)
    check_decode_args(args)
    overhead = overhead_from(args)
    return with_calibration(compare(args.model, gpus, args.mode, args.batch, args.seq, args.dtype, args.fusion,
                                    args.optimizer, args.predictor, parse_prices(args.price_per_hour), overhead,
                                    args.new_tokens, args.kv_cache or "static", loss=not args.no_loss,
                                    disable_compile=args.disable_compile),
                            overhead, args)


def text(r) -> str:
    u = r["unit"]
    m = r["memory"]
    seq = f", seq {r['seq']}" if r["seq"] is not None else ""
    if r.get("mode") == "generate":
        seq = f", prompt {r['prompt']}, {r['new_tokens']} new tokens (step = the whole generation)"
    if r.get("context") is not None:
        seq = f", context {r['context']} (one new token per sequence a step)"
    cache = f", KV cache {m['kv_cache_bytes'] / 2**30:.1f}" if m.get("kv_cache_bytes") else ""
    lines = [f"{r['model']} {r['mode']}, batch {r['batch']}{seq}, {dtype_text(r)}: needs "
             f"{m['total_bytes'] / 2**30:.1f} GiB (weights {m['weights_bytes'] / 2**30:.1f}, grads "
             f"{m['grads_bytes'] / 2**30:.1f}, {optimizer_text(m, '.1f')}, activations "
             f"{m['activations_bytes'] / 2**30:.1f}{cache}{buffers_text(m, '.1f')})",
             *(pricing_text(r["priced"]) if "priced" in r else ()),
             *host_lines(r),
             f"{'gpu':<18} {'step ms':>10} {'p10-p90 ms':>19} {u + '/s':>12} {'fits':>5} "
             f"{'J/step':>9} {'$/M ' + u:>12}"]
    carried = any(row.get("carried_share") for row in r["rows"])  # a column only where some row has it
    if carried:
        lines[-1] += f" {'carried':>8}"
    for row in r["rows"]:
        if row["unsupported"]:
            lines.append(f"{row['gpu']:<18} {'-':>10} {'-':>19} {'-':>12} {'-':>5} {'-':>9} "
                         f"{'-':>12}" + (f" {'-':>8}" if carried else "") + f"  {row['unsupported']}")
            continue
        cost = row[f"cost_per_m_{u}"]
        lo, hi = row["band_ms"]
        band = f"{lo:.2f}-{hi:.2f}" if hi > lo else "-"  # as the step: 16.56 read outside "16.6-16.9"
        lines.append(f"{row['gpu']:<18} {row['step_ms']:>10.2f} {band:>19} {_sig(row[f'{u}_per_s']):>12} "
                     f"{'yes' if row['fits'] else 'NO':>5} {_sig(row['energy_j_per_step']):>9} "
                     f"{('-' if cost is None else _sig(cost)):>12}"
                     + (f" {_share(row.get('carried_share')):>8}" if carried else "")
                     + ttft_text(row)
                     + (f"  max batch {row['max_batch']:,}" if "max_batch" in row else ""))
    short = [row for row in r["rows"] if not row["unsupported"] and not row["fits"]]
    if short:
        half = _half_dtype([row["gpu"] for row in short]) if r["dtype"] in ("fp32", "tf32") else None
        fixes = f"a smaller batch, {half} or more GPUs" if half else "a smaller batch or more GPUs"
        lines.append("fits NO: the step needs more memory than the GPU has; its time is what it "
                     f"would take, and it gets no cost ({fixes})")
        ecc = [f"{row['gpu']} {row['usable_memory_gib']:g} of {row['memory_gib']:g} GiB"
               for row in short if row.get("usable_memory_gib", row["memory_gib"]) < row["memory_gib"]]
        if ecc:  # a 15.5 GiB step on a T4 is NO beside its 16 GiB
            lines.append("  (what a GPU has is less its in-band ECC, on by default on GDDR cards: "
                         + ", ".join(ecc) + ")")
    if carried:
        lines.append("carried: the share of a row's kernel time that takes a kernel-time curve measured on "
                     "another GPU or dtype (kit.workload.carried): none of those kernels was timed on that "
                     "GPU, so its band is wider")
    return "\n".join(lines)


def ttft_text(row) -> str:
    """A generation row's time to first token and per output token (its JSON's ttft_ms and
    tpot_ms, which the text table had left out: a row said only the whole answer's time); none
    for the other modes."""
    if "ttft_ms" not in row:
        return ""
    tpot = "-" if row["tpot_ms"] is None else f"{row['tpot_ms']:.2f} ms"  # one new token: none
    return f"  TTFT {row['ttft_ms']:.2f} ms, TPOT {tpot}"


def _half_dtype(gpus) -> str | None:
    """The 16-bit dtype every one of these GPUs runs, bf16 first: a T4, V100 or P100 that an fp32
    step does not fit had been told to try bf16, which each refuses (fp16 only); a P4 has neither."""
    from kit.hardware import get_gpu

    return next((d for d in ("bf16", "fp16") if all(d in get_gpu(g).dtypes for g in gpus)), None)


def _sig(x: float, digits: int = 3) -> str:
    """x to `digits` significant figures (whole numbers from 10**digits up), never rounded to 0:
    fixed decimals had shown an A100's 0.00043 $/M tokens as 0.000, as free as a GPU priced 0,
    and 0.16 and 0.15 J a step as 0.2 and 0.1; below 1e-4, scientific notation. The decimals
    follow x as rounded to `digits` figures: by x itself 9.9951 printed 10.00, 0.9996 1.000 and
    0.00099951 0.001000, a figure more than the others."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    rounded = float(f"{x:.{digits - 1}e}")
    if abs(rounded) < 1e-4:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{max(digits - 1 - math.floor(math.log10(abs(rounded))), 0)}f}"


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def register(sub):
    p = add_command(sub, "compare", "compare GPUs for one model: time, throughput, memory, energy, cost",
                    run, text)
    add_model_args(p)
    p.add_argument("--gpus", type=nonempty, required=True, help="comma-separated GPU names")
    p.add_argument("--price-per-hour", type=nonempty, default=None, metavar="A=..,B=..",
                   help="your price per GPU-hour in dollars, e.g. h100-sxm=2.5,a100-sxm4-80gb=1.6")
