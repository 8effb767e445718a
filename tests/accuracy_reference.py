"""Reference table of the accuracy sweep: every kernel's true value and partials, by mpmath.

``python tests/accuracy_reference.py`` rewrites ``tests/data/accuracy_reference.json.gz``
(deterministic: the same file, byte for byte, on every run). Needs mpmath (test-only).
``python tests/accuracy_reference.py --verify [STEP]`` checks every STEP-th stored point
against the textbook formulas at 1200 digits (see ``verify``).

For each kernel and dtype (float64, float32) a grid spanning the valid parameter space on a
log scale (see ``GRIDS``; the inputs are rounded to the dtype first and the reference is
computed at exactly those rounded numbers) and, per point:

* ``value`` and every partial (``partials``: one column per differentiated argument), from
  the closed forms below (analytic partials with mpmath's loggamma/digamma), evaluated at
  p digits and again at 2p, p = ``PRECISION`` = 64 doubled until the two agree to ``AGREE``
  relative. A cancellation loses the same digits at both precisions (digamma(k + phi)
  - digamma(phi) - ... ~ 1/phi^2 at phi = 1e20 loses 42, the NB's d/dphi at mean = 1e-200
  about 200), so agreement to 20 digits at p leaves the stored number, from 2p, with more
  than p + 20 >= 84 correct digits;
* ``sens``, the sensitivity of each quantity q to its inputs, sum_i |theta_i dq/dtheta_i|
  over every input (data x, k, n included), by ``mpmath.diff`` in log|theta_i|: the
  condition number of q is ``sens / |q|``. The sweep's bound is a few eps times
  ``max(|q|, sens)``, that is ``|q| max(1, cond)``.

Values and partials are stored as float64 (correctly rounded); one outside float64's range
is stored as +-inf (the kernel must then give that inf). The float32 grid keeps only points
whose value and partials lie within float32's range. The analytic partials are checked
against ``mpmath.diff`` of the value on the first few points of every grid whose inputs all
lie in [1e-4, 1e4] (elsewhere a numeric derivative needs hundreds of digits).
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import sys
import time

import numpy as np

PRECISION = 64  # digits to start from (doubled where needed, see _converged)
AGREE = 1e-20  # relative agreement required between precisions p and 2p
_MAX_PRECISION = 2048
PATH = pathlib.Path(__file__).resolve().parent / "data" / "accuracy_reference.json.gz"
DTYPES = ("float64", "float32")
_DIFF_CHECKED = 4  # analytic partials vs mpmath.diff of the value on this many moderate points


def _mp():
    import mpmath

    return mpmath


# ------------------------------------------------------------------------ closed forms
# Each kernel: (argument names, differentiated names, fn(mp, *args) -> (value, [partials])).


def _normal(mp, x, loc, scale):
    z = (x - loc) / scale
    v = -z * z / 2 - mp.log(scale) - mp.log(2 * mp.pi) / 2
    return v, [-z / scale, z / scale, (z * z - 1) / scale]


def _poisson(mp, k, rate):
    v = k * mp.log(rate) - rate - mp.loggamma(k + 1)
    return v, [(k - rate) / rate]


def _poisson_log(mp, k, log_rate):
    rate = mp.exp(log_rate)
    return k * log_rate - rate - mp.loggamma(k + 1), [k - rate]


# Where an input is absorbed by a much larger one (mu + phi at mu = 1e-300), no working
# precision short of ~600 digits keeps its effect, so the forms below never add terms of
# disparate size and then take the difference: the terms that cancel are combined first.


def _log1p_minus_ratio(mp, r):
    """log1p(r) - r/(1 + r) >= 0, without the cancellation at small r: with s = r/(1 + r),
    log1p(r) = -log(1 - s) = s + s^2/2 + s^3/3 + ..., so this is sum_{m>=2} s^m / m."""
    s = r / (1 + r)
    if s > mp.mpf(0.25):
        return mp.log1p(r) - s
    total, term, m = mp.mpf(0), s, 1
    while True:
        term *= s
        m += 1
        total += term / m
        if term < mp.eps * total:
            return total


def _digamma_step(mp, k, mean, conc):
    """digamma(k + phi) - digamma(phi) - k/(mu + phi). For an integer k <= 1000 the sum
    sum_{j<k} (mu - j) / ((phi + j)(mu + phi)), term by term free of cancellation: at k = 1
    it is mu / (phi (mu + phi)), which the digamma form loses entirely where mu << phi.
    For larger k the digamma form's true size, about k^2 / phi^2 or more, is what the
    doubling of the precision resolves, and the lost k mu / phi^2 is far below it."""
    if k == int(k) and k <= 1000:
        s = mean + conc
        return mp.fsum((mean - j) / ((conc + j) * s) for j in range(int(k)))
    return mp.digamma(k + conc) - mp.digamma(conc) - k / (mean + conc)


def _negative_binomial(mp, k, mean, conc):
    s = mean + conc
    v = (mp.loggamma(k + conc) - mp.loggamma(conc) - mp.loggamma(k + 1)
         - k * mp.log1p(conc / mean) - conc * mp.log1p(mean / conc))
    dmean = conc * (k - mean) / (mean * s)
    # digamma(k + phi) - digamma(phi) - log1p(mu/phi) + (mu - k)/(mu + phi)
    dconc = _digamma_step(mp, k, mean, conc) - _log1p_minus_ratio(mp, mean / conc)
    return v, [dmean, dconc]


def _student_t(mp, x, df, loc, scale):
    z = (x - loc) / scale
    h = (df + 1) / 2
    l1 = mp.log1p(z * z / df)
    v = mp.loggamma(h) - mp.loggamma(df / 2) - mp.log(df * mp.pi) / 2 - mp.log(scale) - h * l1
    dx = -(df + 1) * z / (scale * (df + z * z))
    ddf = ((mp.digamma(h) - mp.digamma(df / 2) - 1 / df) / 2 - l1 / 2
           + h * z * z / (df * (df + z * z)))
    dscale = ((df + 1) * z * z / (df + z * z) - 1) / scale
    return v, [dx, ddf, -dx, dscale]


def _gamma(mp, x, shape, rate):
    v = shape * mp.log(rate) - mp.loggamma(shape) + (shape - 1) * mp.log(x) - rate * x
    return v, [(shape - 1) / x - rate, mp.log(rate) - mp.digamma(shape) + mp.log(x),
               shape / rate - x]


def _log1pexp(mp, t):
    """log(1 + e^t)."""
    return t + mp.log1p(mp.exp(-t)) if t > 0 else mp.log1p(mp.exp(t))


def _sigmoid(mp, t):
    return 1 / (1 + mp.exp(-t))


def _bernoulli_logit(mp, y, logit):
    # y log sigmoid(eta) + (1 - y) log sigmoid(-eta); d/deta = y sigmoid(-eta) - (1 - y)
    # sigmoid(eta): no 1 - sigmoid(eta), which loses e^-eta at eta = 700.
    v = -(y * _log1pexp(mp, -logit) + (1 - y) * _log1pexp(mp, logit))
    return v, [y * _sigmoid(mp, -logit) - (1 - y) * _sigmoid(mp, logit)]


def _binomial_logit(mp, k, n, logit):
    v = (mp.loggamma(n + 1) - mp.loggamma(k + 1) - mp.loggamma(n - k + 1)
         - k * _log1pexp(mp, -logit) - (n - k) * _log1pexp(mp, logit))
    return v, [k * _sigmoid(mp, -logit) - (n - k) * _sigmoid(mp, logit)]


def _eam(mp, r1, r2, r3, amp, beta, c1, c2, c3, c4):
    """One site, three neighbours: E = F(A sum_j exp(-beta r_j)), F(p) = sum_k c_k p^k."""
    e = [mp.exp(-beta * r) for r in (r1, r2, r3)]
    s = sum(e)
    p = amp * s
    c = (c1, c2, c3, c4)
    f = sum(ck * p ** (i + 1) for i, ck in enumerate(c))
    df = sum((i + 1) * ck * p ** i for i, ck in enumerate(c))
    dr = [-beta * amp * df * ej for ej in e]
    dbeta = -amp * df * sum(r * ej for r, ej in zip((r1, r2, r3), e))
    return f, [*dr, df * s, dbeta, *(p ** (i + 1) for i in range(4))]


_EAM_ARGS = ("r1", "r2", "r3", "amp", "beta", "c1", "c2", "c3", "c4")
KERNELS = {
    "normal_lpdf": (("x", "loc", "scale"), ("x", "loc", "scale"), _normal),
    "poisson_lpmf": (("k", "rate"), ("rate",), _poisson),
    "poisson_log_lpmf": (("k", "log_rate"), ("log_rate",), _poisson_log),
    "negative_binomial_lpmf": (("k", "mean", "concentration"), ("mean", "concentration"),
                               _negative_binomial),
    "student_t_lpdf": (("x", "df", "loc", "scale"), ("x", "df", "loc", "scale"), _student_t),
    "gamma_lpdf": (("x", "shape", "rate"), ("x", "shape", "rate"), _gamma),
    "bernoulli_logit_lpmf": (("y", "logit"), ("logit",), _bernoulli_logit),
    "binomial_logit_lpmf": (("k", "n", "logit"), ("logit",), _binomial_logit),
    "eam_energy": (_EAM_ARGS, _EAM_ARGS, _eam),
}

# ------------------------------------------------------------------------------ grids


def _decades(lo, hi, step):
    return [10.0 ** e for e in range(lo, hi + 1, step)]


def _sym(values):
    return sorted({v for a in values for v in (a, -a)})


# Counts: 0 ... 1e12, with the table/Stirling switch of log k! (31, 32, 33) inside.
_COUNTS = [0.0, 1.0, 2.0, 5.0, 31.0, 32.0, 33.0, 100.0, 12985.0, 1e6, 1e9, 1e12]


def _near(center, rel):
    """Points around center: center itself and center * (1 + r) for r in rel."""
    return [center * (1 + r) for r in (0.0, *rel)]


def _normal_grid(big):
    scales = _decades(-big, big, big // 5 or 1) + [1.0, 2.5]
    locs = [0.0, 1.0, -3.7e-7, 2.5e10, -1e25]
    zs = [0.0, 1e-9, -0.3, 1.0, -7.0, 1e3, -1e12, 1e40]
    return [(loc + z * s, loc, s) for s in scales for loc in locs for z in zs]


def _poisson_grid(big):
    rates = _decades(-big, big, big // 6) + [0.1, 1.0, 3.5, 10.0, 1e3, 1e6, 1e9, 1e12]
    pts = [(k, r) for k in _COUNTS for r in rates]
    pts += [(k, r) for k in _COUNTS if k > 0 for r in _near(k, (1e-6, 0.1, -0.5))]
    return pts


def _poisson_log_grid(big):
    etas = [-math.log(10.0) * big, -200.0, -20.0, -3.0, -1e-5, 0.0, 0.5, 2.0, 10.0, 30.0,
            100.0, math.log(10.0) * big]
    pts = [(k, e) for k in _COUNTS for e in etas]
    pts += [(k, math.log(k) + d) for k in _COUNTS if k > 0 for d in (0.0, 1e-6, 0.1, -0.7)]
    return pts


def _negative_binomial_grid(big):
    counts = [0.0, 1.0, 5.0, 33.0, 12985.0, 1e6, 1e12]
    means = _decades(-big, big, big // 2) + [1e-3, 0.7, 8.0, 713.0, 1e6]
    concs = [1e-8, 1e-3, 0.5, 3.0, 100.0, 1e6, 1e10, 1e15, 1e20]
    pts = [(k, m, c) for k in counts for m in means for c in concs]
    pts += [(k, k, c) for k in counts if k > 0 for c in concs]  # mean at the count
    pts += [(5.0, 8.0, 1e15), (12985.0, 713.0, 1e20)]  # the table
    return pts


def _student_t_grid(big):
    dfs = [1e-8, 1e-3, 0.3, 1.0, 2.5, 30.0, 1e4, 1e8, 1e15, 1e17, 1e20]
    loc_scale = [(0.0, 1.0), (-2.5, 10.0 ** -big), (1e5, 10.0 ** (big // 2)), (3e8, 1e-5),
                 (0.0, 10.0 ** big), (-1.0, 10.0 ** -(big // 2))]
    zs = [0.0, 1e-6, 0.8, -1.5, 30.0, 1e6, -1e15]
    pts = [(loc + z * s, df, loc, s) for df in dfs for loc, s in loc_scale for z in zs]
    pts += [(1.5, df, 0.0, 1.0) for df in (1e8, 1e15, 1e17)]  # the table
    return pts


def _gamma_grid(big):
    shapes = [1e-8, 1e-3, 0.5, 1.0, 2.5, 100.0, 1e5, 1e10, 1e14, 1e15]
    rates = _decades(-big, big, big // 3) + [1e-5, 1.0, 1e4, 1e10]
    fs = [1e-10, 0.01, 0.5, 1.0, 1.0 + 1e-6, 3.0, 100.0]  # x as a multiple of the mean
    pts = [(f * a / b, a, b) for a in shapes for b in rates for f in fs]
    pts += [(1.0, 1e10, 1e10), (1.0, 1e14, 1e14)]  # the table
    return pts


def _bernoulli_logit_grid(big):
    logits = [0.0] + _sym([1e-8, 0.3, 1.0, 5.0, 20.0, 37.0, 40.0, 100.0, 700.0, 745.0,
                           1e3, 1e4])
    return [(y, e) for y in (0.0, 1.0) for e in logits]


def _binomial_logit_grid(big):
    ns = [1.0, 2.0, 10.0, 100.0, 1e4, 1e6, 1e9, 1e12, 1e15]
    logits = _sym([1e4, 100.0, 20.0, 3.0, 1e-6]) + [0.0, 0.5]
    pts = []
    for n in ns:
        ks = sorted({0.0, 1.0, float(round(n / 3)), n - 1, n})
        pts += [(k, n, e) for k in ks for e in logits]
        pts += [(k, n, math.log(k / (n - k))) for k in ks if 0 < k < n]  # the mode
    return pts


def _eam_grid(big):
    rs = [(0.1, 0.5, 1.2), (-2.0, 0.0, 3.0), (5.0, 7.5, 10.0)]
    dens = [(math.exp(-3.0), 3.0), (1e-3, 0.5), (10.0, 30.0), (1.0, 1e-4)]
    embs = [(0.0, 1.0, 1.0, 0.25), (-2.0, 0.5, 0.0, 1e-3)]
    return [(*r, *d, *c) for r in rs for d in dens for c in embs]


GRIDS = {
    "normal_lpdf": _normal_grid,
    "poisson_lpmf": _poisson_grid,
    "poisson_log_lpmf": _poisson_log_grid,
    "negative_binomial_lpmf": _negative_binomial_grid,
    "student_t_lpdf": _student_t_grid,
    "gamma_lpdf": _gamma_grid,
    "bernoulli_logit_lpmf": _bernoulli_logit_grid,
    "binomial_logit_lpmf": _binomial_logit_grid,
    "eam_energy": _eam_grid,
}
_BIG = {"float64": 300, "float32": 36}  # decades of the log-scale ranges, per dtype


def _valid(kernel, p, dtype):
    """The point is finite, has no subnormal input (XLA:CPU reads those as 0) and lies
    inside the support with valid parameters: kept in the grid."""
    tiny = float(np.finfo(np.dtype(dtype)).tiny)
    if not all(math.isfinite(v) and (v == 0 or abs(v) >= tiny) for v in p):
        return False
    if kernel in ("normal_lpdf", "student_t_lpdf"):
        return p[-1] > 0
    if kernel == "gamma_lpdf":
        return p[0] > 0
    if kernel == "binomial_logit_lpmf":
        return 0 <= p[0] <= p[1]
    return True


def grid(kernel: str, dtype: str) -> list[tuple[float, ...]]:
    """The kernel's grid points, rounded to ``dtype``, valid, de-duplicated, in a fixed order."""
    rnd = (lambda v: float(np.float32(v))) if dtype == "float32" else float
    with np.errstate(over="ignore"):
        pts = [tuple(rnd(v) for v in p) for p in GRIDS[kernel](_BIG[dtype])]
    return sorted({p for p in pts if _valid(kernel, p, dtype)})


# -------------------------------------------------------------------------- reference


def _quantities(mp, fn, args):
    value, partials = fn(mp, *args)
    return [value, *partials]


def _at(mp, fn, point, dps):
    with mp.workdps(dps):
        return _quantities(mp, fn, [mp.mpf(v) for v in point])


def _converged(mp, kernel, fn, point):
    """The quantities at the lowest precision p >= PRECISION (doubling) whose results agree
    with those at 2p to AGREE relative; returned from 2p, with p."""
    dps = PRECISION
    lo = _at(mp, fn, point, dps)
    while dps <= _MAX_PRECISION:
        hi = _at(mp, fn, point, 2 * dps)
        with mp.workdps(2 * dps):
            if all(abs(a - b) <= AGREE * abs(b) for a, b in zip(lo, hi)):
                return hi, dps
        lo, dps = hi, 2 * dps
    raise AssertionError(f"{kernel} at {point}: no agreement up to {_MAX_PRECISION} digits")


def _log_diff(mp, f, args, i):
    """theta_i df/dtheta_i (0 where theta_i = 0) by mpmath.diff in u = log|theta_i|: no step
    crosses 0 however small theta_i is."""
    theta = args[i]
    if theta == 0:
        return mp.mpf(0)
    sign = 1 if theta > 0 else -1

    def moved(u):
        a = list(args)
        a[i] = sign * mp.exp(u)
        return f(a)

    return mp.diff(moved, mp.log(abs(theta)))


def _sensitivity(mp, fn, point, which, dps):
    """sum_i |theta_i dq/dtheta_i| for quantity number ``which`` (at ``dps`` digits:
    mpmath.diff raises the working precision further by itself)."""
    with mp.workdps(dps):
        args = [mp.mpf(v) for v in point]
        q = lambda a: _quantities(mp, fn, a)[which]
        return sum(abs(_log_diff(mp, q, args, i)) for i in range(len(args)))


def _to_float(mp, q) -> float:
    """Correctly rounded float64, +-inf beyond its range (0.0 below its subnormals)."""
    if abs(q) > mp.mpf(np.finfo(np.float64).max):
        return math.copysign(math.inf, q)
    return float(q)


def _check_partials(mp, kernel, fn, point, partials, diff_idx, dps):
    """The analytic partials against mpmath.diff of the value (a check of the formulas)."""
    with mp.workdps(dps):
        args = [mp.mpf(v) for v in point]
        value = lambda a: fn(mp, *a)[0]
        for col, i in enumerate(diff_idx):
            if args[i] == 0:
                continue
            numeric = _log_diff(mp, value, args, i) / args[i]
            scale = abs(numeric) + abs(value(args) / args[i])  # a zero partial: absolute
            if abs(numeric - partials[col]) > mp.mpf(10) ** -20 * scale:
                raise AssertionError(f"{kernel} at {point}: partial {col} is {partials[col]}, "
                                     f"mpmath.diff gives {numeric}")


def reference(kernel: str, dtype: str, points=None) -> dict:
    """The table of one kernel and dtype (see the module docstring for its fields), over its
    grid or over the given ``points`` (tuples of the kernel's arguments)."""
    mp = _mp()
    names, diff, fn = KERNELS[kernel]
    diff_idx = [names.index(n) for n in diff]
    limit = float(np.finfo(np.dtype(dtype)).max)
    rows = {"inputs": [], "value": [], "partials": [], "sens": []}
    checked = 0
    for point in grid(kernel, dtype) if points is None else points:
        hi, dps = _converged(mp, kernel, fn, point)
        if checked < _DIFF_CHECKED and all(v == 0 or 1e-4 <= abs(v) <= 1e4 for v in point):
            _check_partials(mp, kernel, fn, point, hi[1:], diff_idx, dps)
            checked += 1
        qs = [_to_float(mp, q) for q in hi]
        if dtype == "float32" and not all(abs(q) <= limit for q in qs):
            continue  # float32 grid: value and partials within float32's range only
        sens = [_to_float(mp, _sensitivity(mp, fn, point, j, dps)) for j in range(len(qs))]
        rows["inputs"].append(list(point))
        rows["value"].append(qs[0])
        rows["partials"].append(qs[1:])
        rows["sens"].append(sens)
    return {"args": list(names), "diff": list(diff), **rows}


def generate() -> dict:
    tables = {}
    for kernel in KERNELS:
        for dtype in DTYPES:
            t0 = time.perf_counter()
            tables[f"{kernel}/{dtype}"] = t = reference(kernel, dtype)
            print(f"{kernel:24s} {dtype}: {len(t['value']):4d} points "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return {"precision_digits": PRECISION, "tables": tables}


def write(doc: dict, path: pathlib.Path = PATH) -> None:
    """gzip'd JSON (floats by repr: exact; inf as Infinity), no timestamp: deterministic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                filename="") as f:
        f.write(text)


# ------------------------------------------------------------------ independent check
# The textbook forms, where the ones above were rewritten to avoid absorption: at
# ``_VERIFY_DIGITS`` digits nothing is absorbed (inputs span 600 decades), except
# exp(-|logit|) beyond e^-2000, whose points are skipped.
_VERIFY_DIGITS = 1200


def _negative_binomial_textbook(mp, k, mean, conc):
    s = mean + conc
    v = (mp.loggamma(k + conc) - mp.loggamma(conc) - mp.loggamma(k + 1) + k * mp.log(mean)
         + conc * mp.log(conc) - (k + conc) * mp.log(s))
    dconc = mp.digamma(k + conc) - mp.digamma(conc) + mp.log(conc) + 1 - mp.log(s) - (k + conc) / s
    return v, [k / mean - (k + conc) / s, dconc]


def _bernoulli_logit_textbook(mp, y, logit):
    return y * logit - mp.log(1 + mp.exp(logit)), [y - 1 / (1 + mp.exp(-logit))]


def _binomial_logit_textbook(mp, k, n, logit):
    v = (mp.loggamma(n + 1) - mp.loggamma(k + 1) - mp.loggamma(n - k + 1) + k * logit
         - n * mp.log(1 + mp.exp(logit)))
    return v, [k - n / (1 + mp.exp(-logit))]


_TEXTBOOK = {"negative_binomial_lpmf": _negative_binomial_textbook,
             "bernoulli_logit_lpmf": _bernoulli_logit_textbook,
             "binomial_logit_lpmf": _binomial_logit_textbook}


def verify(step: int) -> int:
    """Every ``step``-th stored point against the textbook forms at _VERIFY_DIGITS digits:
    the stored float64 numbers must be the same to a relative 4e-16 (one rounding)."""
    mp = _mp()
    with gzip.open(PATH, "rt") as f:
        tables = json.load(f)["tables"]
    bad = checked = 0
    for key, t in tables.items():
        kernel = key.split("/")[0]
        fn = _TEXTBOOK.get(kernel, KERNELS[kernel][2])
        for i in range(0, len(t["value"]), step):
            point = t["inputs"][i]
            if kernel.endswith("logit_lpmf") and abs(point[-1]) > 2000:
                continue
            stored = [t["value"][i], *t["partials"][i]]
            fresh = [_to_float(mp, q) for q in _at(mp, fn, point, _VERIFY_DIGITS)]
            checked += 1
            for a, b in zip(stored, fresh):
                if not (a == b or abs(a - b) <= 4e-16 * abs(b)):
                    bad += 1
                    print(f"{key} at {point}: stored {stored}, textbook {fresh}", file=sys.stderr)
                    break
    print(f"verified {checked} points, {bad} disagree", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--verify"]:  # python tests/accuracy_reference.py --verify [STEP]
        return verify(int(argv[1]) if len(argv) > 1 else 10)
    t0 = time.perf_counter()
    doc = generate()
    write(doc)
    n = sum(len(t["value"]) for t in doc["tables"].values())
    print(f"wrote {PATH} ({n} points, {PATH.stat().st_size / 1e3:.0f} kB, "
          f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
