"""Pipeline schedules: the order in which one stage runs its forward and backward passes.

Each item is (phase, micro_batch, chunk): phase "F" or "B", chunk the model chunk (virtual
stage) on this stage (0 unless interleaved).

* GPipe (Huang et al. 2019): all forwards, then all backwards.
* 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs pp − s − 1 warm-up forwards,
  then alternates one forward and one backward, then drains the remaining backwards.
* Interleaved 1F1B (Megatron-LM, Narayanan et al. SC'21): v chunks per stage; micro-batches
  go in groups of pp through chunk 0, then chunk 1, ...; warm-up (pp − s − 1)·2 + (v − 1)·pp.

Bubble: with equal stage times and free communication, GPipe and 1F1B idle (pp − 1) passes
out of m + pp − 1, a share (pp − 1) / (m + pp − 1) of the iteration (bubble_fraction). Against
the useful work alone that is (pp − 1) / m, the form Narayanan et al. quote. Interleaving
divides the bubble by v: (pp − 1) / (v · m + pp − 1) of the iteration, (pp − 1) / (v · m) of
the work.
"""
from __future__ import annotations

from kit.errors import KitError


def gpipe(stage: int, pp: int, m: int) -> list[tuple[str, int, int]]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def one_f_one_b(stage: int, pp: int, m: int) -> list[tuple[str, int, int]]:
    w = min(pp - stage - 1, m)
    out = [("F", i, 0) for i in range(w)]
    for i in range(m - w):
        out += [("F", w + i, 0), ("B", i, 0)]
    out += [("B", i, 0) for i in range(m - w, m)]
    return out


def interleaved(stage: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    if m % pp:
        raise KitError(f"interleaved 1F1B needs the micro-batches per replica ({m}) to be a "
                       f"multiple of --pp {pp}")
    total = m * v

    def fwd(k):
        return ("F", (k // (pp * v)) * pp + k % pp, (k // pp) % v)

    def bwd(k):
        return ("B", (k // (pp * v)) * pp + k % pp, v - 1 - (k // pp) % v)

    w = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    out = [fwd(k) for k in range(w)]
    for i in range(total - w):
        out += [fwd(w + i), bwd(i)]
    out += [bwd(k) for k in range(total - w, total)]
    return out


def schedule(kind: str, stage: int, pp: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    if kind == "gpipe":
        return gpipe(stage, pp, m)
    if kind == "1f1b":
        return one_f_one_b(stage, pp, m)
    if kind == "interleaved":
        return interleaved(stage, pp, m, v)
    raise KitError(f"unknown pipeline schedule {kind!r}: choose gpipe, 1f1b or interleaved")


def in_flight(kind: str, stage: int, pp: int, m: int, v: int = 1, chunk: int | None = None) -> int:
    """Most chunks whose activations a stage holds at once (forwards not yet backwarded); of
    model chunk `chunk` alone when given."""
    return int(peak_held(kind, stage, pp, m, v,
                         [1 if chunk is None or c == chunk else 0 for c in range(v)]))


def peak_held(kind: str, stage: int, pp: int, m: int, v: int, chunk_bytes) -> float:
    """Most bytes a stage holds at once when each forward of model chunk c keeps chunk_bytes[c]
    until its backward. Chunks of unequal size (an uneven layer split, or MoE layers that fall
    unevenly on a stage's chunks) peak below max(chunk_bytes) x in_flight, which assumed every
    pass in flight was of the largest chunk."""
    live = peak = 0.0
    for phase, _, c in schedule(kind, stage, pp, m, v):
        live += chunk_bytes[c] if phase == "F" else -chunk_bytes[c]
        peak = max(peak, live)
    return peak


def bubble_fraction(kind: str, pp: int, m: int, v: int = 1) -> float:
    """Idle share of the iteration in the ideal schedule (equal stage times, free comm):
    (pp - 1) / (m + pp - 1), not the (pp - 1) / m of bubble time over useful work."""
    if kind == "interleaved":
        return (pp - 1) / (v * m + pp - 1)
    return (pp - 1) / (m + pp - 1)
