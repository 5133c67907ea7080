"""`kit models`: the zoo, with each model's family, parameters, default sequence and modes."""
from kit.cli import add_command


def run(args):
    """The table, from the cache when the zoo's code has not changed since it was counted
    (building the largest zoo models on the meta device takes seconds)."""
    import hashlib
    import pickle
    from pathlib import Path

    from kit import __version__
    from kit.source_digest import process_stamp
    from kit.workload import zoo

    # the table's own code, beside the zoo's and modes', by its contents (its whole-second mtime
    # had let two checkouts written in the same second share a stale table), as this process
    # imported it: a kernel left open across an edit of this file had stored its old table
    # under the new file's key
    own = process_stamp("models table", [("cmd_models.py", Path(__file__))])
    code = zoo._code_stamp()
    if code is None or own is None:  # the code on disk is not what this process imported
        return _rows()
    stamp = hashlib.sha256(f"{__version__}-{code}-{own}".encode()).hexdigest()[:16]
    path = zoo.cache_dir() / f"models-{stamp}.pkl"
    try:
        rows = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - a damaged cache (any unpickling error) is rebuilt
        rows = None
    if _table_like(rows):
        return rows
    rows = _rows()
    zoo._write(path, rows)  # atomically; an unwritable cache is skipped
    return rows


def _table_like(rows) -> bool:
    """Whether a cached table has the rows text() reads (a damaged cache file that unpickles
    to 5 had been a TypeError traceback)."""
    keys = {"model", "family", "params", "default_seq", "modes", "aliases"}
    return (isinstance(rows, list) and bool(rows)
            and all(isinstance(r, dict) and keys <= set(r) for r in rows))


def _rows() -> list[dict]:
    from kit.workload import zoo

    rows = []
    for name in zoo.zoo_names():
        cfg = zoo.config(name)
        model = zoo.build(name)  # on the meta device: no memory, a fraction of a second
        params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        modes = ["train", "inference", *(["decode", "generate"] if zoo.decodes(name) else [])]
        rows.append({"model": name, "family": cfg.get("model_type", "gpt2"), "params": params,
                     "default_seq": zoo.default_seq(name) if zoo.uses_seq(name) else None,
                     "reads": zoo.inputs_instead_of_seq(name) or "token ids",
                     "max_seq": zoo.max_seq(name), "modes": modes,
                     "aliases": list(zoo.ZOO[name][2])})
    return rows


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def text(rows):
    head = ["model", "family", "params", "seq", "modes", "aliases"]
    table = [[r["model"], r["family"], _params(r["params"]),
              "-" if r["default_seq"] is None else str(r["default_seq"]), ",".join(r["modes"]),
              ", ".join(r["aliases"])] for r in rows]
    widths = [max(len(t[i]) for t in [head, *table]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i == 2 else c.ljust(w) for i, (c, w) in enumerate(zip(t, widths))).rstrip()
             for t in [head, *table]]
    return "\n".join(lines + [f"{len(rows)} zoo models (seq: the default of `kit predict`); an HF-style "
                              "config.json or a Python path 'module:callable' works too"])


def register(sub):
    add_command(sub, "models", "list the zoo: each model's family, parameters, default sequence "
                "and modes", run, text)
