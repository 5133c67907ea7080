"""`kit op KIND ...`: predict one operation on one GPU, with its tiles, waves and bound."""
from dataclasses import replace

from kit.cli import add_command, positive_int
from kit.cli.cmd_predict import add_weights_option
from kit.cli.outputs import nonempty
from kit.hardware import DTYPES


def _gpu_args(p, dtype=True):
    p.add_argument("--gpu", required=True, help="GPU key, name or alias (see `kit gpus`)")
    if dtype:
        p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--predictor", default="auto", help="auto, wave, roofline, ...")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
    add_weights_option(p)


def _build(args):
    from kit import ops

    kind = args.op_kind
    # the leading dimensions of contiguous operands, as a measured row's
    # (kit.op_counts.lead_alignment): an odd n or k takes the unaligned path a 16-bit GEMM runs on
    if kind == "gemm":
        return ops.Gemm(m=args.m, n=args.n, k=args.k, b=args.b, dtype=args.dtype,
                        align=ops.lead_alignment(args.n, args.k))
    if kind == "linear":
        op = ops.linear(args.tokens, args.in_features, args.out_features, args.dtype)
        return replace(op, align=ops.lead_alignment(op.n, op.k))
    if kind == "elementwise":
        return ops.Elementwise(args.kind, args.numel, args.dtype)
    if kind in ("softmax", "layernorm", "rmsnorm"):
        cls = {"softmax": ops.Softmax, "layernorm": ops.LayerNorm, "rmsnorm": ops.RMSNorm}[kind]
        return cls(args.rows, args.cols, args.dtype)
    if kind == "dropout":
        return ops.Dropout(args.numel, args.dtype, args.p)
    if kind == "embedding":
        return ops.EmbeddingBag(args.batch, args.rows, args.dim, args.pooling, args.dtype)
    if kind == "memcpy":
        return ops.Memcpy(args.bytes, args.direction)
    raise AssertionError(kind)


def run(args):
    from kit.api import predict_op
    from kit.hardware import load_gpu_file

    if args.gpu_file:
        load_gpu_file(args.gpu_file)
    return predict_op(_build(args), args.gpu, args.predictor)


def text(r):
    lines = [f"{r['op']} on {r['gpu']} ({r['dtype'] or '-'}), predictor {r['predictor']}",
             f"  latency   {r['latency_ms']:.4g} ms   (band {r['latency_p10_ms']:.4g}-{r['latency_p90_ms']:.4g})",
             f"  roofline  {r['roofline_ms']:.4g} ms   {r['bound']}-bound: compute {r['compute_ms']:.4g} ms,"
             f" memory {r['memory_ms']:.4g} ms",
             *([] if r["op"] == "memcpy" else  # a copy over a link has no FLOPs and no ridge
               [f"  intensity {r['intensity_flops_per_byte']:.1f} FLOP/B vs ridge {r['ridge_flops_per_byte']:.1f} FLOP/B"]),
             f"  work      {r['flops']:.3g} FLOPs, {r['bytes']:.3g} bytes"]
    if r.get("fill_note"):
        lines.append(f"  fill      {r['fill_note']}")
    source = str(r.get("source", ""))
    if source.startswith("kit.predict.tensor_core (carried from the amd"):
        lines.append("  source    a curve of AMD's matrix-core GEMMs (kit.predict.tensor_core.CDNA_GEMM):"
                     " fitted on rocBLAS's FP32 MFMA GEMMs of NeuSight's MI100 and MI210 rows, the only"
                     " AMD matrix-core kernels measured, carried to this dtype as a share of its peak,"
                     " with a wider band: no AMD 16-bit or FP8 GEMM was timed; the latency is that"
                     " curve plus the dispatch floor; the tiling below is the kit's tile choice, for"
                     " the picture")
    elif source.startswith("kit.predict.tensor_core"):
        carried = "carried" in source
        lines.append("  source    a curve measured on an H200 (kit.predict.tensor_core): Hopper's aligned"
                     " tensor-core kernels reach a share of the roofline set by their size, not by"
                     " their tiles, so the latency is that curve plus the dispatch floor"
                     + ("; carried over to this GPU as a share of its own peak, with a wider band:"
                        " no tensor-core kernel of it was timed" if carried else "")
                     + "; the tiling below is the kit's tile choice, for the picture")
    if r.get("tile") != "gemv" and source and not source.startswith("kit.predict.tensor_core"):
        lines.append(f"  source    {source}")
    if r.get("tile") == "gemv":
        lines.append(f"  source    {source}" if source.startswith(
                     ("its two-row twin", "the time of a twin with more rows", "its time on the "))
                     else f"  source    {_blas(r['gpu'])}'s gemv kernels (m or n of 1) stream the matrix once: a share"
                     " of the DRAM bandwidth measured on an H200 (kit.predict.gemv) plus the dispatch"
                     " floor, not a GEMM tile")
        lines.append(f"  utilisation {100 * r['utilisation']:.1f}% of the roofline")
    elif r["tiles"]:
        split = (f" split-k {r['split_k']} (the reduction split {r['split_k']} ways, then a kernel"
                 " sums the partial outputs)," if r.get("split_k", 1) > 1 else ",")
        fill = 100 * r["last_wave_fill"]
        fill = "<1%" if fill < 0.5 else f"{fill:.0f}%"  # one tile of 264 slots is 0.4%, not "0% full"
        twin = r.get("tiled_as")  # a bound set the time: the tiles are its twin's
        of = "" if not twin else (f"of what set its time, m {twin['m']} n {twin['n']} k {twin['k']}"
                                  + (f" b {twin['b']}" if twin["b"] != 1 else "")
                                  + ("" if twin["gpu"] == r["gpu"] else f" on the {twin['gpu']}") + ": ")
        lines.append(f"  tiling    {of}tile {r['tile']}{split} {r['tiles']} tile{'s' * (r['tiles'] != 1)},"
                     f" {r['blocks_per_sm']} blocks/SM (limited by {r['occupancy_limiter']}),"
                     f" {r['waves']} wave{'s' * (r['waves'] != 1)}, last wave {fill} full")
        if r.get("tile_choice"):
            lines.append("  " + tile_choice_text(r["tile_choice"], r.get("split_k", 1), bool(r.get("source"))))
        # utilisation is bound / latency; the tile predictor's bound is the larger of the roofline
        # and its waves at peak (one wave of a 1x1x1e7 GEMM's single tile runs on one SM)
        bound_ms = r["utilisation"] * r["latency_ms"]
        reread = r.get("reread_bytes") or 0.0
        reread_ms = r["memory_ms"] * (r["bytes"] + reread) / r["bytes"] if r["bytes"] else 0.0
        if abs(bound_ms - r["roofline_ms"]) <= 1e-6 * r["roofline_ms"]:
            lines.append(f"  utilisation {100 * r['utilisation']:.1f}% of the roofline")
        elif reread and abs(bound_ms - reread_ms) <= 1e-6 * reread_ms:
            lines.append(f"  utilisation {100 * r['utilisation']:.1f}% of its DRAM time with re-reads,"
                         f" {bound_ms:.4g} ms: the rows resident at once spill the L1 and L2, so"
                         f" {reread:.3g} bytes of re-reads reach DRAM, above the roofline")
        else:
            lines.append(f"  utilisation {100 * r['utilisation']:.1f}% of its wave bound, {bound_ms:.4g} ms"
                         f" ({r['waves']} waves of {r['tile']} tiles at peak), above the roofline")
    return "\n".join(lines)


def register(sub):
    from kit.cli import _Parser
    from kit.ops import ELEMENTWISE_FLOPS

    op = sub.add_parser("op", help="predict one operation on one GPU", description=
                        "Predict one operation on one GPU: roofline, tiles, waves and latency.")
    kinds = op.add_subparsers(dest="op_kind", metavar="KIND", parser_class=_Parser, required=True)
    g = add_command(kinds, "gemm", "C[b,m,n] = A[b,m,k]·B[b,k,n]", run, text)
    for d in "mnk":
        g.add_argument(f"--{d}", type=positive_int, required=True)
    g.add_argument("--b", type=positive_int, default=1, help="batch (bmm)")
    _gpu_args(g)
    li = add_command(kinds, "linear", "nn.Linear(in, out) on `tokens` rows", run, text)
    li.add_argument("--tokens", type=positive_int, required=True)
    li.add_argument("--in-features", type=positive_int, required=True)
    li.add_argument("--out-features", type=positive_int, required=True)
    _gpu_args(li)
    e = add_command(kinds, "elementwise", "an elementwise op over numel elements", run, text)
    e.add_argument("--kind", default="add", choices=sorted(ELEMENTWISE_FLOPS))
    e.add_argument("--numel", type=positive_int, required=True)
    _gpu_args(e)
    for name in ("softmax", "layernorm", "rmsnorm"):
        r = add_command(kinds, name, f"{name} over the last dim of (rows, cols)", run, text)
        r.add_argument("--rows", type=positive_int, required=True)
        r.add_argument("--cols", type=positive_int, required=True)
        _gpu_args(r)
    dr = add_command(kinds, "dropout", "training-mode dropout", run, text)
    dr.add_argument("--numel", type=positive_int, required=True)
    dr.add_argument("--p", type=float, default=0.1)
    _gpu_args(dr)
    em = add_command(kinds, "embedding", "an embedding bag (basic: every row from DRAM)", run, text)
    for a in ("batch", "rows", "dim", "pooling"):
        em.add_argument(f"--{a}", type=positive_int, required=True)
    _gpu_args(em)
    mc = add_command(kinds, "memcpy", "a memory copy", run, text)
    mc.add_argument("--bytes", type=positive_int, required=True)
    mc.add_argument("--direction", default="d2d", choices=["d2d", "h2d", "d2h"])
    _gpu_args(mc, dtype=False)


def _blas(gpu_key: str) -> str:
    """The vendor's BLAS library for the GPU a result names (rocBLAS on an MI300X, not cuBLAS)."""
    from kit.hardware import get_gpu
    from kit.predict.gemv import blas_library

    return blas_library(get_gpu(gpu_key))


def tile_choice_text(choice: list, split: int, bound: bool) -> str:
    """kit op's line on the tile chooser: the likeliest tiles, and which ones the time mixes
    (bound: a curve, bound or cap set the time instead, named on the source line)."""
    mixed = [c for c in choice if c["weight"] > 0]
    seen = ", ".join(f"{c['tile']} p {c['p']:.2f}" for c in choice)
    of = f" of the split GEMM ({split} ways)" if split > 1 else ""
    if len(mixed) == 1:
        text = f"choice    the tile chooser's likeliest tiles{of}: {seen}; the tile-MLP prices {mixed[0]['tile']}"
    else:
        weights = ", ".join(f"{c['tile']} {c['weight']:.2f}" for c in mixed)
        text = (f"choice    the tile chooser's likeliest tiles{of}: {seen}; it is unsure, so the tile-MLP"
                f" prices a weighted mean over {weights} (kit.predict.tile_mlp.tile_weights)")
    return text + ("; the source line's bound set the time, not this" if bound else "")
