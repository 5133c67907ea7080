"""Bandwidth against message size: a latency floor, a sigmoid rise in log size, a plateau.

After Lin et al. (IEEE TPDS 2025), who model collective bandwidth as three regimes. Here:

    busbw(S) = B / (1 + (S_half / S)^k)^(1/k)          (generalised logistic in ln S)
    time(S)  = max(floor, f * S / busbw(S))            f = nccl-tests busbw factor
             = max(floor, (f / B) * (S^k + S_half^k)^(1/k))

* small S: busbw grows in proportion to S (latency-bound; time = f*S_half/B, or the floor),
* large S: busbw -> B (bandwidth-bound plateau),
* k sets how sharp the knee is: k = 1 is the alpha-beta model latency + S/bandwidth, large k is
  max(latency, S/bandwidth) (perfect overlap). The presets are the k = 1 case.

A library that switches algorithm with the size (gloo near 2 MiB, NCCL between tree and ring)
changes the curve: then a curve is piecewise, `upper` (another such curve) answering from
`switch_bytes` up. fit_curve places the break where the data say, and only when the second
regime pays for its extra parameters (Schwarz's BIC on log time). The upper regime keeps the
lower one's floor (the host-side floor is the call's, and sizes past a switch cannot tell it),
and a break goes only where the regimes cross or the upper one is the slower across the gap: the
time never stays flat past a switch nor falls as the size grows.
Sizes in bytes, times in microseconds inside this module (nccl-tests prints us), ms outside.
A system's curves, their file and the checks of them: kit.comm.calibration.
numpy is imported inside the functions that use it: a preset's prediction (kit comm predict, the
parallel model's collectives) uses none, and a fresh process had spent 0.1 s importing it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, replace

from kit.comm.conventions import busbw_factor, canonical_kind
from kit.errors import KitError


@dataclass(frozen=True)
class BandwidthCurve:
    kind: str
    ranks: int
    floor_us: float  # host-side floor of the measured time
    busbw_max_gbs: float  # plateau B
    half_bytes: float  # S_half: size where the latency and bandwidth terms are equal
    steepness: float  # k
    n_points: int = 0  # measurements it was fitted to (0: a preset)
    fit_mape: float = float("nan")  # mean |error| / measured time on those points
    min_bytes: float = 0.0
    max_bytes: float = 0.0
    switch_bytes: float = math.inf  # from this size up `upper` answers (an algorithm switch)
    upper: BandwidthCurve | None = None
    nodes: int = 0  # nodes the measured group spanned (0: not known, e.g. PARAM output)

    @property
    def factor(self) -> float:
        return busbw_factor(self.kind, self.ranks) if self.ranks > 1 else 1.0

    def time_us(self, nbytes):
        if self.upper is not None:
            if isinstance(nbytes, float):
                return self.upper.time_us(nbytes) if nbytes >= self.switch_bytes else self._own_us(nbytes)
            import numpy as np

            s = np.asarray(nbytes, dtype=float)
            return np.where(s < self.switch_bytes, self._own_us(s), self.upper.time_us(s))
        return self._own_us(nbytes)

    def _own_us(self, nbytes):
        if isinstance(nbytes, float) and self.steepness == 1.0:  # fast scalar path (alpha-beta)
            return max(self.floor_us, self._rise_us(nbytes))
        import numpy as np

        return np.maximum(self.floor_us, self._rise_us(nbytes))

    def _rise_us(self, nbytes):
        """This regime's time without its floor: (f / B) * (S^k + S_half^k)^(1/k)."""
        if isinstance(nbytes, float) and self.steepness == 1.0:
            return self.factor * (nbytes + self.half_bytes) / (self.busbw_max_gbs * 1e3)
        import numpy as np

        s = np.asarray(nbytes, dtype=float)
        k = self.steepness
        # (S^k + S_half^k)^(1/k) computed in log space so that large k cannot overflow
        m = np.logaddexp(k * np.log(np.maximum(s, 1e-30)), k * math.log(self.half_bytes)) / k
        return self.factor / (self.busbw_max_gbs * 1e3) * np.exp(m)

    def parts_us(self, nbytes: float) -> tuple[float, float]:
        """(latency, bandwidth) of one size, in us, adding up to its time above the floor, so
        that time = max(floor, latency + bandwidth) as a preset's is: bandwidth is the size at the
        plateau busbw of the regime that answers (f * S / B), latency the rest of that regime's
        curve. For k = 1 that is f * S_half / B at every size; for another k it varies with S."""
        piece = self.regime(nbytes)
        bandwidth = piece.factor * nbytes / (piece.busbw_max_gbs * 1e3)
        # at most the time: round-off had left a latency of -2e-9 us past a steep regime's knee
        return max(float(piece._rise_us(float(nbytes))) - bandwidth, 0.0), bandwidth

    def busbw_gbs(self, nbytes):
        import numpy as np

        s = np.asarray(nbytes, dtype=float)
        return self.factor * s / (self.time_us(s) * 1e3)

    def latency_us(self) -> float:
        """Time of a vanishing message: the larger of the floor and f*S_half/B."""
        return max(self.floor_us, self.factor * self.half_bytes / (self.busbw_max_gbs * 1e3))

    def crossover_bytes(self) -> float:
        """Size where the bandwidth term f*S/B equals the latency term (of the regime it falls in)."""
        x = self.latency_us() * self.busbw_max_gbs * 1e3 / self.factor
        return x if self.upper is None or x < self.switch_bytes else max(self.switch_bytes,
                                                                          self.upper.crossover_bytes())

    def regime(self, nbytes: float) -> BandwidthCurve:
        """The single-regime curve that answers for this size."""
        c = self
        while c.upper is not None and nbytes >= c.switch_bytes:
            c = c.upper
        return c

    def plateau_gbs(self) -> float:
        """busbw as the size grows without bound: the last regime's plateau."""
        return self.regime(math.inf).busbw_max_gbs

    @property
    def breaks_bytes(self) -> tuple[float, ...]:
        return () if self.upper is None else (self.switch_bytes, *self.upper.breaks_bytes)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.nodes:  # unknown: as files written before nodes were recorded
            del d["nodes"]
        if self.upper is None:
            del d["switch_bytes"], d["upper"]
        else:
            d["upper"] = self.upper.to_dict()
        return d


def curve_from_dict(d: dict, where: str = "curve") -> BandwidthCurve:
    for name in ("ranks", "nodes"):  # int("8") and int(8.5) would take a string or a fraction
        v = d.get(name, 0) if isinstance(d, dict) else 0
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise KitError(f"{where}: {name} must be a whole number (not a string or a fraction), "
                           f"got {v!r}")
    try:
        c = BandwidthCurve(kind=canonical_kind(d["kind"]), ranks=int(d["ranks"]),
                           floor_us=float(d["floor_us"]), busbw_max_gbs=float(d["busbw_max_gbs"]),
                           half_bytes=float(d["half_bytes"]), steepness=float(d["steepness"]),
                           n_points=int(d.get("n_points", 0)), fit_mape=float(d.get("fit_mape", "nan")),
                           min_bytes=float(d.get("min_bytes", 0)), max_bytes=float(d.get("max_bytes", 0)),
                           nodes=int(d.get("nodes", 0)))
        if d.get("upper") is not None:
            up = curve_from_dict(d["upper"], f"{where} upper regime")
            c = replace(c, switch_bytes=float(d["switch_bytes"]), upper=up)
    except KeyError as e:
        raise KitError(f"{where}: missing field {e.args[0]}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise KitError(f"{where}: bad value ({e})") from None
    finite = all(math.isfinite(v) for v in (c.busbw_max_gbs, c.half_bytes, c.steepness, c.floor_us))
    if c.ranks < 1:
        raise KitError(f"{where}: ranks must be a whole number >= 1, got {d['ranks']!r}")
    if not 0 <= c.nodes <= c.ranks:
        raise KitError(f"{where}: nodes must be a whole number from 1 to ranks (or 0: not known), "
                       f"got {d['nodes']!r}")
    if not (finite and c.busbw_max_gbs > 0 and c.half_bytes > 0 and c.steepness > 0 and c.floor_us >= 0):
        raise KitError(f"{where}: busbw_max_gbs, half_bytes and steepness must be positive and finite, "
                       "floor_us finite and >= 0")
    if c.upper is not None and not (c.switch_bytes > 0 and c.upper.kind == c.kind and c.upper.ranks == c.ranks):
        raise KitError(f"{where}: an upper regime needs a positive switch_bytes and the same kind and ranks")
    if not 0 <= c.min_bytes <= c.max_bytes and (c.min_bytes, c.max_bytes) != (0, 0):  # (0, 0): not recorded
        raise KitError(f"{where}: the sizes fitted must run from min_bytes up to max_bytes (both >= 0), "
                       f"got min_bytes {c.min_bytes:g} and max_bytes {c.max_bytes:g}")
    return c


NOISE_FLOOR = 0.02  # log-time residual (2%) below which a better fit is taken to be noise
MIN_REGIME = 5  # sizes each regime needs on each side of a break: more than its four parameters


def fit_curve(kind: str, ranks: int, nbytes, time_us, breaks: int | None = None) -> BandwidthCurve:
    """Fit the curve to measured (size, time) pairs; needs >= 4 distinct sizes.

    Least squares on log time, from several starting points. breaks=None tries one algorithm
    switch at every gap between sizes that leaves MIN_REGIME sizes on each side, and keeps it
    when it lowers Schwarz's BIC, n ln(max(RSS/n, NOISE_FLOOR^2)) + p ln n, below one regime's
    (p = 4 for one regime, 4 + 3 + 1 for two, the upper taking the lower's floor, and their
    break) and _switch finds a place for it; breaks=0 never switches."""
    import numpy as np

    kind = canonical_kind(kind)
    s = np.asarray(nbytes, dtype=float)
    t = np.asarray(time_us, dtype=float)
    ok = (s > 0) & (t > 0) & np.isfinite(s) & np.isfinite(t)
    if not ok.all():  # a 0.00 time (below the tool's resolution) or a bad row: said, not hidden
        import warnings

        warnings.warn(f"{kind} on {ranks} ranks: {int((~ok).sum())} of {len(ok)} measurement(s) "
                      "left out of the fit (a time or size that is 0, negative or not finite)")
    s, t = s[ok], t[ok]
    if len(np.unique(s)) < 4:
        raise KitError(f"fitting a {kind} curve on {ranks} ranks needs at least 4 distinct sizes "
                       f"with positive times, got {len(np.unique(s))}")
    if breaks not in (None, 0):
        raise KitError(f"breaks must be None (detect one algorithm switch) or 0 (none), got {breaks!r}")
    order = np.argsort(s, kind="stable")
    s, t = s[order], t[order]
    one = _fit_regime(kind, ranks, s, t)
    best, best_bic = one, _bic(one, s, t, 4)
    sizes = np.unique(s)
    # at the noise floor already, no break can lower the BIC (it only adds parameters)
    search = breaks is None and _rss(one, s, t) / len(s) > NOISE_FLOOR ** 2
    for j in range(MIN_REGIME, len(sizes) - MIN_REGIME + 1) if search else ():
        lo_mask = s < sizes[j]
        lower = _fit_regime(kind, ranks, s[lo_mask], t[lo_mask])
        upper = _fit_regime(kind, ranks, s[~lo_mask], t[~lo_mask], floor_us=lower.floor_us)
        at = _switch(lower, upper, sizes[j - 1], sizes[j])
        if at is None:
            continue
        c = replace(lower, switch_bytes=at, upper=upper)
        bic = _bic(c, s, t, 4 + 3 + 1)
        if bic < best_bic:
            best, best_bic = c, bic
    mape = float(np.mean(np.abs(best.time_us(s) - t) / t))
    return replace(best, n_points=int(len(s)), fit_mape=mape, min_bytes=float(s.min()), max_bytes=float(s.max()))


def _rss(c: BandwidthCurve, s, t) -> float:
    import numpy as np

    return float(np.sum((np.log(c.time_us(s)) - np.log(t)) ** 2))


def _bic(c: BandwidthCurve, s, t, p: int) -> float:
    n = len(s)
    return n * math.log(max(_rss(c, s, t) / n, NOISE_FLOOR ** 2)) + p * math.log(n)


def _switch(lower: BandwidthCurve, upper: BandwidthCurve, a: float, b: float) -> float | None:
    """Where the regimes meet between sizes a < b: their crossing (a library switches to the faster
    algorithm), found in log size; else, where the upper regime is the slower across the gap, the
    geometric mean of a and b (the time jumps up there). None where the upper regime is the faster
    across the whole gap: switching to it would make a larger message faster than a smaller one."""
    from scipy.optimize import brentq

    def gap(log_x):
        x = math.exp(log_x)
        return math.log(lower.time_us(x) / upper.time_us(x))

    lo, hi = math.log(a), math.log(b)
    if gap(lo) * gap(hi) > 0:
        return math.sqrt(a * b) if gap(lo) < 0 else None
    return math.exp(brentq(gap, lo, hi, xtol=1e-9))


def _fit_regime(kind, ranks, s, t, floor_us: float | None = None) -> BandwidthCurve:
    """One regime: floor, plateau, half-size and steepness; floor_us given: that floor, and the
    other three fitted (an upper regime, which inherits the call's floor from the lower one)."""
    import numpy as np
    from scipy.optimize import least_squares

    f = busbw_factor(kind, ranks) if ranks > 1 else 1.0
    bus = f * s / (t * 1e3)
    b0 = float(bus.max())
    t_min = float(t.min())
    lo = np.log([max(t_min * 1e-3, 1e-6), b0 * 0.05, s.min() * 1e-3, 0.3])
    hi = np.log([t_min * 1.5, b0 * 50, s.max() * 1e3, 12.0])
    free = slice(0, 4) if floor_us is None else slice(1, 4)

    def params(p):
        return np.exp(p) if floor_us is None else np.concatenate([[floor_us], np.exp(p)])

    def model(p, x):
        return BandwidthCurve(kind, ranks, *params(p)).time_us(x)

    # starting points: an alpha-beta line through the data (weighted by 1/t), plus a small grid
    a_w = np.vstack([np.ones_like(s), s]).T / t[:, None]
    alpha, beta = np.linalg.lstsq(a_w, np.ones_like(t), rcond=None)[0]
    starts = []
    if alpha > 0 and beta > 0:
        starts.append((t_min, f / (beta * 1e3), alpha / beta, 1.0))
    half0 = max(t_min * b0 * 1e3 / f, s.min())
    starts += [(t_min, b0 * 1.05, half0, 1.0), (t_min * 0.05, b0 * 1.05, half0, 2.5)]
    best = None
    for start in starts:
        p0 = np.clip(np.log(start), lo + 1e-9, hi - 1e-9)[free]
        r = least_squares(lambda p: np.log(model(p, s)) - np.log(t), p0, bounds=(lo[free], hi[free]),
                          loss="soft_l1", f_scale=0.05, max_nfev=300)
        if best is None or r.cost < best.cost:
            best = r
    p = params(best.x)
    return BandwidthCurve(kind, ranks, *(float(v) for v in p),
                          n_points=int(len(s)), fit_mape=float(np.mean(np.abs(model(best.x, s) - t) / t)),
                          min_bytes=float(s.min()), max_bytes=float(s.max()))
