"""`kit validate --labels DIR`: predict every measured whole-model configuration and score it.

DIR holds NeuSight's label layout, <GPU>/<model>-<train|inf>-<seq>-<batch>[-option].json with
{e2e_latency, fw_latency, bwall_latency} in ms. Settings match how the labels were measured:
FP32, training = forward + backward with no optimizer step, inference = one forward pass,
"-fusion" = torch.compile (the kit's compiled fusion). Configurations that cannot be predicted
(GPU not in the catalog, model not in the zoo, multi-GPU options) are listed with the reason;
an unreadable label file is also a note. A configuration labelled twice on one GPU (under two
folder names of it, T4/ and Tesla_T4/) is scored once: the second label is listed as skipped.
Each prediction carries its p10-p90 band (band_ms) and whether the label lies in it (in_band);
the summaries give that share as band_coverage.
"""
import warnings
from pathlib import Path

from kit.cli import add_command
from kit.cli.cmd_predict import add_weights_option
from kit.cli.outputs import nonempty

MULTI_GPU = ("dp", "tp", "pp")


def validate(labels_dir, predictor: str = "auto", models=None, gpus=None) -> dict:
    from kit.data.configs import label_times_ms, parse_label_name, read_json
    from kit.errors import KitError
    from kit.hardware import get_gpu
    from kit.workload.iteration import iteration
    from kit.workload.models import graph_of
    from kit.workload.zoo import resolve

    from kit.predict import get_predictor

    get_predictor(predictor)  # an unknown predictor is one error, not a skip of every label
    models = {resolve(m) for m in models} if models else None
    root = Path(labels_dir)
    if not root.is_dir():
        raise KitError(f"label directory {'is a file, not a folder' if root.exists() else 'not found'}: {root}")
    files = sorted(root.glob("*/*.json"))
    # JSON at another depth (label/x.json, label/GPU/sub/x.json) is no label of a GPU folder:
    # listed as skipped, not passed over unsaid
    astray = sorted(f for f in root.rglob("*.json") if len(f.relative_to(root).parts) != 2 and f.is_file())
    if not files:
        seen = (f"; {len(astray)} JSON file(s) at another depth, e.g. "
                f"{astray[0].relative_to(root).as_posix()}" if astray else "")
        raise KitError(f"no label files under {root} (expected <GPU>/<model>-<train|inf>-<seq>-<batch>.json)"
                       + seen)
    configs, skipped = [], []
    for f in astray:
        depth = len(f.relative_to(root).parts) - 1
        where = "in the label folder itself" if depth == 0 else f"{depth} folders deep"
        skipped.append({"file": str(f), "label": f.relative_to(root).as_posix(),
                        "reason": f"not read as a label: it is {where}, and labels are "
                        "<GPU>/<model>-<train|inf>-<seq>-<batch>.json, one folder deep"})
    seen: dict = {}  # (gpu, model, mode, seq, batch, option) -> the row of its first scored label
    labelled: set = set()  # the models the readable labels are of (named when none is chosen)
    for f in files:
        label = f.relative_to(root).as_posix()  # the file as the user finds it under --labels
        try:
            lab = parse_label_name(f.stem, f)
            data = read_json(f)  # a folder, binary, malformed JSON: one KitError naming it
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object with e2e_latency, got {type(data).__name__}")
            measured, fwd, bwd = label_times_ms(data)  # the rules kit data summary --part labels applies
        except (KitError, ValueError, KeyError, TypeError) as e:
            msg = str(e)  # the file is named once, by the skip line, not again inside the reason
            msg = "the file" + msg[len(str(f)):] if msg.startswith(str(f)) else msg
            skipped.append({"file": str(f), "label": label, "reason": f"unreadable label: {msg}"})
            continue
        option = lab["option"] if isinstance(lab["option"], str) else ""
        labelled.add(lab["model"])
        if models and _zoo_name(lab["model"]) not in models:  # before its skips: not asked about
            continue
        row = {"gpu": f.parent.name, "model": lab["model"], "mode": "train" if lab["mode"] == "train" else "inference",
               "seq": lab["seq"], "batch": lab["batch"], "option": option, "measured_ms": measured,
               "label": label}
        try:
            gpu = get_gpu(f.parent.name).key
        except KitError:
            skipped.append({**row, "reason": f"GPU {f.parent.name!r} is not in the catalog"})
            continue
        row["gpu"] = gpu
        if gpus and gpu not in gpus:
            continue
        key = (gpu, row["model"], row["mode"], row["seq"], row["batch"], option)
        if key in seen:  # the same GPU under two folder names (T4/ and Tesla_T4/): scored once
            first = seen[key]
            values = ("the same measurement" if first["measured_ms"] == measured else
                      f"measured {first['measured_ms']:g} ms there, {measured:g} ms here")
            reason = (f"the same configuration as {first['label']} (both folders are GPU {gpu}; "
                      f"{values}): counted once")
            skipped.append({**row, "reason": reason})
            warnings.warn(f"{label}: {reason}")
            continue
        try:
            model = resolve(lab["model"])
        except KitError:
            skipped.append({**row, "reason": f"model {lab['model']!r} is not in the zoo"})
            continue
        if option.startswith(MULTI_GPU):  # 4-GPU labels: kit/parallel/neusight.py
            from kit.parallel.neusight import predict_label

            if row["mode"] != "train":  # it had been priced as a training step, scored as inference
                skipped.append({**row, "reason": f"multi-GPU option {option!r} on an inference label: "
                                "NeuSight's dpN/tpN/ppN_M labels are training steps, and the kit "
                                "predicts them as such"})
                continue
            try:
                multi = predict_label(model, lab["seq"], lab["batch"], option, gpu, predictor)
            except KitError as e:
                skipped.append({**row, "reason": str(e)})
                continue
            pred = multi["predicted_ms"]
            row.update(predicted_ms=pred, ape=abs(pred - measured) / measured,
                       **_band(multi["band_ms"], measured),
                       predictor=multi["predictor"], system=multi["system"])
            seen[key] = row  # once scored: a twin of a skipped label is skipped for its own reason
            configs.append(row)
            continue
        if option and option != "fusion":
            skipped.append({**row, "reason": f"unknown option {option!r}"})
            continue
        try:  # one label the kit cannot predict (seq past the position table, ...) is skipped
            graph = graph_of(model, lab["batch"], lab["seq"], row["mode"], "fp32", None,
                             loss=False)  # NeuSight's labels: backward from the logits
            it = iteration(graph, gpu, predictor=predictor, fusion="compiled" if option == "fusion" else "eager")
        except KitError as e:
            skipped.append({**row, "reason": str(e)})
            continue
        pred = it.total_ms
        row.update(predicted_ms=pred, ape=abs(pred - measured) / measured,
                   **_band([it.total_p10_ms, it.total_p90_ms], measured), predictor=it.predictor)
        if row["mode"] == "train" and fwd:  # a label without bwall_latency has no measured backward
            row.update(measured_fwd_ms=fwd, predicted_fwd_ms=it.phases_ms.get("fwd"),
                       measured_bwd_ms=bwd or None, predicted_bwd_ms=it.phases_ms.get("bwd"))
        seen[key] = row
        configs.append(row)
    if len(skipped) == len(files) + len(astray) and all("file" in s for s in skipped):
        first = next(s for s in skipped if Path(s["file"]) in files)  # an unreadable label, not a stray
        raise KitError(f"none of the {len(files)} label file(s) under {root} could be read; "
                       f"{first['file']}: {first['reason']}")
    if models and labelled and not any(_zoo_name(m) in models for m in labelled):
        # nothing to list or score: one line naming the filter (it was an empty table saying
        # "no configuration could be predicted (0 skipped, listed below)", then an error)
        raise KitError(f"no label under {root} is of the chosen model(s) {', '.join(sorted(models))}; "
                       f"its labels are of {', '.join(sorted(labelled))}")
    for s in skipped:  # besides the listing: a note, even with --json
        if "file" in s:
            warnings.warn(f"{s['file']}: skipped, {s['reason']}")
    summary = []
    groups: dict = {}
    for c in configs:
        groups.setdefault((c["gpu"], c["mode"]), []).append(c)
    for (gpu, mode), group in sorted(groups.items()):
        summary.append({"gpu": gpu, "mode": mode, "configs": len(group), **_scores(group)})
    return {"configs": configs, "summary": summary, "skipped": skipped,
            "overall": {"configs": len(configs), **_scores(configs)}}


def _zoo_name(model: str) -> str | None:
    """A label's model as the zoo names it (--models is matched so), or None if not in the zoo."""
    from kit.errors import KitError
    from kit.workload.zoo import resolve

    try:
        return resolve(model)
    except KitError:
        return None


def _band(band, measured: float) -> dict:
    """The prediction's p10-p90 band and whether the measurement lies in it."""
    lo, hi = float(band[0]), float(band[1])
    return {"band_ms": [lo, hi], "in_band": bool(lo <= measured <= hi)}


def _scores(configs: list) -> dict:
    """Mean and max APE, and the share of measurements inside their band (None when empty)."""
    if not configs:
        return {"mean_ape": None, "max_ape": None, "band_coverage": None}
    apes = [c["ape"] for c in configs]
    return {"mean_ape": sum(apes) / len(apes), "max_ape": max(apes),
            "band_coverage": sum(c["in_band"] for c in configs) / len(configs)}


def _models(text):
    """--models as a list (None: every model): "gpt2," is gpt2, as in every other name list;
    "", "," and "gpt2,,bert-large" are one KitError (",", "" had validated every model)."""
    from kit.errors import KitError, comma_names

    if text is None:
        return None
    names = comma_names(text, "--models")
    if not names:
        raise KitError(f"--models is empty ({text!r}); name some zoo models, e.g. gpt2,bert-large")
    return names


def run(args):
    if args.gpu_file:  # labels of a GPU the catalog lacks
        from kit.hardware import load_gpu_file

        load_gpu_file(args.gpu_file)
    r = validate(args.labels, args.predictor, models=_models(args.models))
    if not r["configs"]:  # nothing validated: list what was skipped and why, then fail
        from kit.cli import json_text, result_stream
        from kit.errors import KitError

        if not r["skipped"]:  # nothing to list: the error line alone
            raise KitError(f"no label under {args.labels} is of the chosen model(s) {args.models or ''}".rstrip())
        print(json_text(r) if args.json else text(r), file=result_stream(), flush=True)
        raise KitError(f"no label under {args.labels} could be validated: all "
                       f"{len(r['skipped'])} were skipped (listed above)")
    return r


def text(r) -> str:
    lines = [f"{'gpu':<16} {'model':<11} {'mode':<9} {'seq':>5} {'batch':>5} {'option':<7} "
             f"{'measured':>10} {'predicted':>10} {'APE':>7}  in p10-p90 band"]
    for c in r["configs"]:
        lo, hi = c["band_ms"]
        lines.append(f"{c['gpu']:<16} {c['model']:<11} {c['mode']:<9} {c['seq']:>5} {c['batch']:>5} "
                     f"{c['option'] or '-':<7} {c['measured_ms']:>8.2f}ms {c['predicted_ms']:>8.2f}ms "
                     f"{100 * c['ape']:>6.1f}%  {'yes' if c['in_band'] else 'no ':<3} "
                     f"({lo:.2f}-{hi:.2f} ms)")
    lines.append("mean APE per GPU and mode:")
    for s in r["summary"]:
        lines.append(f"  {s['gpu']:<16} {s['mode']:<9} {100 * s['mean_ape']:5.1f}%  (max "
                     f"{100 * s['max_ape']:.1f}%, {s['configs']} configs, "
                     f"{100 * s['band_coverage']:.0f}% in band)")
    o = r["overall"]
    if not o["configs"]:
        lines.append(f"no configuration could be predicted ({len(r['skipped'])} skipped, listed below)")
    else:
        lines.append(f"overall: {100 * o['mean_ape']:.1f}% mean APE over {o['configs']} configs, "
                     f"{100 * o['band_coverage']:.0f}% of the measurements in their p10-p90 band")
    for s in r["skipped"]:
        where = s.get("label") or s.get("file") or f"{s['gpu']}/{s['model']}-{s['mode']}-{s['seq']}-{s['batch']}{'-' + s['option'] if s.get('option') else ''}"
        lines.append(f"skipped {where}: {s['reason']}")
    return "\n".join(lines)


def register(sub):
    p = add_command(sub, "validate", "predict every whole-model label and report the errors", run, text)
    p.add_argument("--labels", type=nonempty, required=True, metavar="DIR", help="NeuSight label directory (label/<GPU>/...json)")
    p.add_argument("--predictor", default="auto", help="kernel predictor: auto (the default), wave, roofline, ...")
    p.add_argument("--models", type=nonempty, default=None, help="only these zoo models (comma-separated)")
    p.add_argument("--gpu-file", type=nonempty, metavar="FILE", help="load your own GPU(s) from a JSON file first")
    add_weights_option(p)  # --weights DIR (kit.cli.cmd_predict)
