"""The words of the study notebooks (build.py assembles and executes them).

``intro``: the question in our own words. ``code_md``: what the code cell shows.
``conclusion``: written after reading a full run's tables (machine named in it).
``claims``: Python run in the notebook's last cell; each ``claim(text, bool)`` re-checks one
statement of the conclusion against ``result`` (the study's numbers above it).
"""

NOTEBOOKS = [
    {
        "file": "01_ad_backends_normal.ipynb",
        "module": "normal_ad",
        "intro": """
# 01 — Which AD mode for the gradient of a normal log-likelihood?

**The write-up.** The GitHub gist "Automatic Differentiation Benchmarks" (luiarthur,
November 2022) times the gradient of a normal log-density in Julia with Tracker,
ReverseDiff, Zygote, ForwardDiff and complex-step differentiation.

**The question.** We want ∇θ of f(θ) = Σᵢ log N(yᵢ | θᵢ, s): one scalar out, n numbers in. Theory
says reverse mode should cost a small constant times the value whatever n is, while forward
mode, complex step and finite differences each need one pass per element of θ, so their cost
grows like n². The write-up measured exactly that in Julia, with reverse mode at 5–20× the value.
Here we ask how JAX's modes compare on the same function and sizes (n = 10, 100, 1000, plus
10⁶ where only reverse mode and fusedlp are feasible), whether a generic reverse pass already
reaches the value's cost, and what `fusedlp.normal_lpdf` adds. All timings are float64 on
this machine's CPU and compared as ratios to the value, as the write-up's figures came from
another machine.
""",
        "code_md": """
## The code

Each variant is a JAX function of θ, jitted and compiled ahead of time (compile time is
reported apart). Forward mode is `jax.jacfwd` (one tangent per element, vmapped); complex step
evaluates the write-up's analytic `normlpdf` at θ + i·h·eⱼ for every j; finite differences use
n + 1 evaluations. A *call floor* row times a jitted function that does no work, the fixed
cost of calling compiled code from Python.
""",
        "conclusion": """
Measured on a 2-core AMD EPYC virtual machine, JAX 0.10.2 on CPU, float64 (the tables above);
the write-up's figures come from another machine, so we compare ratios to the value.

* **Reverse mode is the right mode, and in JAX it is as cheap as the value.** `jax.grad`
  costs 0.3–0.95× the value at every n here, against 5–20× for Zygote and ReverseDiff in the
  write-up. The gradient with respect to the means is (y − θ)/s², one elementwise pass that XLA
  compiles without a tape; the value also has to sum, which the gradient does not.
* **Forward mode, complex step and finite differences grow like n²**, as in the write-up:
  from about the value's cost at n = 10 to 60–110× the value at n = 1000 (the write-up: 356× for
  ForwardDiff and 1300× for complex step). Batching the n passes with `vmap` makes them much
  cheaper than Julia's loops, but does not change the order.
* **At n ≤ 1000 nothing here costs much more than calling compiled code at all**: a jitted
  call that does no work takes about 5 µs on this machine, and the value and every
  reverse-mode gradient sit within 1–2 µs of it. The write-up's n = 10…1000 timings (0.1–7 µs for
  the value in Julia) are below JAX's floor; a JAX user with such small problems batches
  them (`vmap`) or puts the whole loop under one `jit` (as `fusedlp.fit` does).
* **fusedlp.normal_lpdf adds nothing for this gradient**: it matches `jax.grad` (and NumPyro)
  within noise because XLA already finds the optimal gradient with respect to a vector of
  means.
  Here, with s = 1 a constant of the program, XLA even simplifies the plain formula, and
  fusedlp's value-and-gradient is no faster than autodiff's (within ±10 % at n ≤ 10⁴, where
  the timings are steady). Its rule pays off where autodiff does not find the shortcut —
  scalar `loc`/`scale`, whose gradients are sums (the kernel benchmark: autodiff
  value-and-gradient 1.6× the fused one at N = 10⁶). At n = 10⁴ value-and-gradient costs
  about 1.2× the value for both. At 10⁵–10⁶ the timings on this VM spread as wide as their
  medians (IQR column: calls that wait for XLA's second thread, and page faults of a fresh
  8 MB gradient array), so ratios there move by ±30 % between runs.
""",
        "claims": """
ns = [n for n in studies_sizes]
claim("reverse mode (jax.grad) costs at most 1.1x the value at every n",
      all(median(result, n, "reverse") <= 1.1 * median(result, n, "value") for n in ns))
claim("forward mode, complex step and finite differences cost over 20x the value at n = 1000",
      all(median(result, 1000, v) > 20 * median(result, 1000, "value")
          for v in ("forward", "complex_step", "finite_diff")))
claim("at n <= 1000 the value is within 3 us of the jit call floor",
      all(median(result, n, "value") - median(result, n, "call_floor") < 3e-6
          for n in ns if n <= 1000))
claim("fusedlp's gradient is within 15% of jax.grad's at every n <= 10^4",
      all(abs(median(result, n, "fused") / median(result, n, "reverse") - 1) < 0.15
          for n in ns if n <= 10**4))
claim("at n = 10^4 value_and_grad costs under 1.5x the value, fused and autodiff alike",
      None if 10**4 not in ns else all(median(result, 10**4, v) < 1.5 * median(
          result, 10**4, "value") for v in ("fused_vg", "reverse_vg")))
claim("fusedlp's value_and_grad is within 0.8-1.3x of autodiff's at every n <= 10^4",
      all(0.8 <= median(result, n, "fused_vg") / median(result, n, "reverse_vg") <= 1.3
          for n in ns if n <= 10**4))
""",
    },
    {
        "file": "02_jacobian_subset.ipynb",
        "module": "jacobian",
        "intro": """
# 02 — A Jacobian with respect to one scalar, and differentiating a subset of arguments

**The write-up.** The Julia Discourse thread "Automatic differentiation performance &
computing derivatives of only a subset of the arguments", about Zygote and ForwardDiff.

**The question.** rs(d, x) = d − (d·f(x))/(f(x)·f(x)) f(x) with f(m)ᵢ = exp(−1.5 (tᵢ − m)²)
maps a vector d and **one scalar** x to a vector. Its derivative with respect to x is a single
column. The write-up found Zygote's reverse-mode `jacobian` more than 50× slower than finite
differences and ForwardDiff twice as fast as them, and asked two things: is reverse mode the
wrong tool here, and can one tell AD not to differentiate d? We time `jax.jacrev` and
`jax.jacfwd` (with respect to x only and to both arguments) against finite differences at
the write-up's n = 21 and at larger n, repeat it for the scalar output Σ rs², and read XLA's own
operation counts to see what work is spent on d when only x is asked for.
""",
        "code_md": """
## The code

`argnums` picks the arguments to differentiate. A reverse-mode Jacobian needs one backward pass
per output element (`jax.jacrev` vmaps them); a forward-mode one needs one forward pass per
input element — here one, for the scalar x. There is no fusedlp kernel in this study: rs is
not a sum of log-densities, and the point is choosing the AD mode.
""",
        "conclusion": """
Measured on a 2-core AMD EPYC virtual machine, JAX 0.10.2 on CPU, float64 (the tables above).

* **At the write-up's n = 21 every method costs about the same** — finite differences,
  `jax.jacrev` and `jax.jacfwd` with respect to x all take about 1.1× the value, which is
  itself near the ~5 µs cost of calling any jitted function. The write-up's gap (Zygote's
  reverse-mode Jacobian over 50× slower than finite differences) does not appear, because
  `jacrev` vmaps its n backward passes into one compiled program instead of running them one
  by one.
* **But the write-up's diagnosis is right, and it shows as n grows.** A reverse-mode Jacobian of a
  vector output needs one backward pass per output: at n = 2001, `jacrev` with respect to x
  costs well over 1000× the value, while `jacfwd` (one tangent for the one scalar) stays near
  1.2× the value at every n, just as ForwardDiff was the fast choice in the write-up.
* **Differentiating a subset is automatic and spends less work**: `argnums` says which
  arguments to differentiate, and XLA's operation count is lower for x alone than for
  (d, x), in both modes (table "Work"); the Jacobian with respect to d is an n × n matrix
  that is never formed when only x is asked for.
* **For the scalar output Σ rs², reverse mode is as fast as forward mode** (within about
  10 % of each other, 1.0–1.25× the value), where the write-up saw Zygote 8× slower than
  ForwardDiff. There is no fusedlp kernel here: the lesson is to pick the mode by the shape
  of the derivative (`jacfwd` for few inputs, `grad`/`jacrev` for a scalar output).
""",
        "claims": """
from bench.studies.jacobian import work

ns = studies_sizes
claim("at n = 21 every derivative w.r.t. x costs at most 1.3x the value",
      all(median(result, 21, v) <= 1.3 * median(result, 21, "value")
          for v in ("finite_diff", "jacrev_x", "jacfwd_x")))
claim("forward mode w.r.t. x stays within 1.5x of the value at every n",
      all(median(result, n, "jacfwd_x") <= 1.5 * median(result, n, "value") for n in ns))
claim("at n = 2001, jacrev w.r.t. x costs over 100x jacfwd w.r.t. x",
      None if 2001 not in ns else
      median(result, 2001, "jacrev_x") > 100 * median(result, 2001, "jacfwd_x"))
claim("XLA counts fewer flops for x only than for (d, x), reverse and forward, every n",
      all(work(result, n, a + "_x")["flops"] < work(result, n, a + "_dx")["flops"]
          for n in ns for a in ("jacrev", "jacfwd")))
claim("scalar output: jax.grad w.r.t. x is within 1.25x of jax.jacfwd w.r.t. x at every n",
      all(median(result, n, "s_grad_x") <= 1.25 * median(result, n, "s_jacfwd_x") for n in ns))
""",
    },
    {
        "file": "03_eager_vs_fused_broadcast.ipynb",
        "module": "broadcast",
        "intro": """
# 03 — Eager, compiled and fused: the gradient of Σ exp(x)

**The write-up.** The ReverseDiff.jl GitHub issue #215, "Record `Broadcast.broadcasted`
instead of `Broadcast.broadcast`".

**The question.** ReverseDiff records one tape instruction for an eager broadcast but one
instruction per element (2n − 1 of them) for a lazy one, which made the gradient of
Σ exp(xᵢ) at n = 1000 sixteen times slower; compiling the tape won back about a third. The
general lesson: a reverse-mode tool that records scalar operations pays per element. What
does this become in JAX? Its tracer records whole-array operations, so the program has the
same size for any n; what remains is running those operations one at a time (no `jit`)
versus compiling them into one loop, and autodiff versus a hand-fused rule that hands the
`exp` the value computed to the gradient. We time all of them at n = 10 … 10⁶.
""",
        "code_md": """
## The code

`sum_exp` is the fused kernel: a `jax.custom_vjp` whose forward pass keeps exp(x) as the
residual and whose backward pass multiplies it by the incoming cotangent — the pattern every
fusedlp kernel follows. "op by op" runs `jax.grad(f)` without `jit`: each primitive is
dispatched on its own.
""",
        "conclusion": """
Measured on a 2-core AMD EPYC virtual machine, JAX 0.10.2 on CPU, float64 (the tables above).

* **JAX has no per-element tape.** The traced gradient has the same four operations at every
  n (table "Program size"), where ReverseDiff's lazy broadcast records 2n − 1 scalar
  instructions. The write-up's problem — recording a broadcast element by element — cannot arise.
* **What remains is dispatch.** Run op by op (no `jit`), `jax.grad` costs about half a
  millisecond whatever n is up to 10⁴: the cost is launching each primitive (and the
  autodiff machinery) from Python, not the arithmetic. That is 70–100× the jitted gradient at
  n ≤ 1000, a larger ratio than the write-up's lazy/eager 16×; `jit` removes it entirely.
* **Jitted autodiff is already fused.** XLA compiles the gradient into one elementwise loop,
  and the hand-fused `custom_vjp` (which passes the `exp` from the value to the gradient) is
  within 15 % of it up to n = 10⁴; the write-up's compiled tape still cost 5.4× the eager
  broadcast. At 10⁵–10⁶ both spread over hundreds of microseconds to milliseconds between
  calls on this VM (the IQR column), so their medians there say little.
  For a function this simple, `jax.jit(jax.grad(f))` is what to write; fusedlp's kernels pay
  off where the density has work autodiff cannot see past (notebook 05, and the kernel
  benchmark).
* At n = 10⁶ the gradient costs about as much as the value or more: it must write an 8 MB
  array, the value only a scalar.
""",
        "claims": """
ns = studies_sizes
sizes_ = result["extra"]["program_size"]
claim("the traced gradient has the same number of operations at every n",
      len({e["grad_jaxpr_eqns"] for e in sizes_}) == 1)
claim("op by op, the gradient costs over 20x the jitted gradient at n <= 10^4",
      all(median(result, n, "grad_eager") > 20 * median(result, n, "grad")
          for n in ns if n <= 10**4))
claim("op by op / jit at n = 1000 exceeds the write-up's lazy / eager ratio (16x)",
      median(result, 1000, "grad_eager") / median(result, 1000, "grad") > 16)
claim("the fused custom_vjp and jitted jax.grad are within 15% of each other at n <= 10^4",
      all(abs(median(result, n, "fused") / median(result, n, "grad") - 1) < 0.15
          for n in ns if n <= 10**4))
""",
    },
    {
        "file": "04_eam_potential.ipynb",
        "module": "eam",
        "intro": """
# 04 — An EAM-style potential: hand gradient, autodiff, fusedlp and a hand loop

**The write-up.** The Julia Discourse thread "Zygote Performance", which compares
hand-written gradients of an EAM-style potential with Zygote's.

**The question.** E(x) = F(Σᵢ ρ(xᵢ)) with ρ(r) = exp(−3(r + 1)) and F(p) = p² + p³ + p⁴/4 is
the shape of an embedded-atom potential. Its author hand-writes every gradient because
reverse-mode AD cost 4–30× the value, and evaluates such models millions of times on small
inputs (n = 100). In the write-up, the hand gradient cost about 2× the value, naive Zygote 8–9×,
and a vectorised hand loop computing value and gradient together beat everything. We ask
where JAX's autodiff, the write-up's hand gradient transcribed to JAX, `fusedlp.eam_energy` and
a numba loop land at n = 100, 1000 and 10⁶ — and, since the real workload is many small
evaluations, what one evaluation costs inside a batched call.
""",
        "code_md": """
## The code

`deam` is the write-up's `deam!` transcribed (it computes the exp twice, once for ρ, once for ρ′).
The numba loops are the hand-optimised reference: one thread, `fastmath`, two passes like the
write-up's LoopVectorization loop. The batch rows evaluate B sites of n = 100 in one call and
report time per site.
""",
        "conclusion": """
Measured on a 2-core AMD EPYC virtual machine, JAX 0.10.2 on CPU, float64 (the tables above).

* **In JAX the hand gradient is not needed.** The write-up's `deam!` transcribed to JAX, naive
  `jax.grad` and `fusedlp.eam_energy` cost the same within noise at every n (within 15 % up
  to n = 10⁴; the 10⁵–10⁶ timings spread widely on this VM): XLA compiles the
  naive reverse pass into the same loops a hand gradient would run, so the 4–9× penalty of
  naive Zygote in the write-up does not exist here.
* **Up to n = 1000 every call is near JAX's dispatch floor** (about 7 µs on this VM; value
  and gradients alike about 8–10 µs), so gradient/value is about 1. From n = 10⁴ the real
  ratio shows: each gradient costs about 1.2× the value at 10⁴ and 1.4–1.6× at 10⁵–10⁶,
  because it writes n numbers while the value writes one — the same structure as the
  write-up's hand gradient (2.2× in Julia).
* **The numba loop wins where dispatch dominates and loses where arithmetic does**: at
  n = 100 one thread of numba computes value and gradient in about 2 µs, a quarter of a
  jitted call;
  from n = 10⁴ it is 2–5× slower than XLA, which vectorises `exp` and splits big loops over
  both cores.
* **Batched, the model is cheap**: evaluated as one call on B = 10 000 sites of n = 100 (the
  write-up's real workload), one gradient costs under 0.1 µs per site — about 1.3× the
  batched value, and about 1/90 of a single-site call. On this machine that is faster than
  the write-up's AVX-512 hand loop (0.11 µs, another machine) and than our numba loop over the
  batch (one thread).
""",
        "claims": """
single = studies_sizes
grads = ("deam", "naive", "fused")
claim("at n <= 1000 every gradient costs at most 1.3x the value",
      all(median(result, n, g) <= 1.3 * median(result, n, "value")
          for n in single if n <= 1000 for g in grads))
claim("the hand gradient, naive jax.grad and fusedlp are within 15% of each other, n <= 10^4",
      all(max(median(result, n, g) for g in grads) <= 1.15 * min(median(result, n, g)
          for g in grads) for n in single if n <= 10**4))
claim("at n = 10^4 each gradient costs 1.05-1.6x the value",
      None if 10**4 not in single else all(
          1.05 <= median(result, 10**4, g) / median(result, 10**4, "value") <= 1.6
          for g in grads))
claim("at n = 10^6 each gradient costs 1.2-2x the value",
      None if 10**6 not in single else all(
          1.2 <= median(result, 10**6, g) / median(result, 10**6, "value") <= 2
          for g in grads))
claim("the one-thread numba loop beats every jitted call at n = 100 and loses at n >= 10^4",
      median(result, 100, "numba_vg") < median(result, 100, "fused")
      and all(median(result, n, "numba_vg") > median(result, n, "fused_vg")
              for n in single if n >= 10**4))
claim("batched, one n = 100 gradient costs under 1/20 of a single fused gradient call",
      median(result, 100, "b_fused") < median(result, 100, "fused") / 20)
""",
    },
    {
        "file": "05_poisson_likelihood.ipynb",
        "module": "poisson",
        "intro": """
# 05 — The gradient of a Poisson log-likelihood

**The write-up.** The Julia Discourse thread "Speeding up gradient of logpdf", which
compares ReverseDiff, Enzyme and JAX on a Poisson log-likelihood.

**The question.** L(λ) = Σᵢ log Poisson(cᵢ | λᵢ) at n = 1000, with counts c ~ Poisson(1.2). In
Julia, ReverseDiff's gradient cost 2–10× the value until Enzyme matched it; in JAX the author
saw the jitted gradient run *faster* than the value, and un-jitted JAX 70× slower. We explain
that, and ask what a user should call: autodiff of `jax.scipy.stats.poisson.logpmf`, NumPyro's
`Poisson.log_prob`, or `fusedlp.poisson_lpmf` (normalized, or `normalized=False`, which
drops the −log c! a gradient never needs) — at the write-up's n = 1000 and at 10⁶, jitted and not,
against a numba loop.
""",
        "code_md": """
## The code

Value, gradient and value-and-gradient are timed for each route; "no jit" rows call the same
functions op by op. The numba loops compute log c! with `math.lgamma` (normalized) or skip it.
""",
        "conclusion": """
Measured on a 2-core AMD EPYC virtual machine, JAX 0.10.2 on CPU, float64 (the tables above).

* **The write-up's puzzle reproduces and has a plain cause.** Jitted `jax.grad` of
  `jax.scipy.stats.poisson.logpmf` costs about 15 % of the value at n = 1000 (the
  write-up: a third), most of it the call's fixed cost, and 2–6 % of it from n = 10⁴. The
  value must compute log c! with `lgamma`, the dearest operation here; the gradient
  c/λ − 1 does not need it, and XLA deletes what the gradient does not use. Un-jitted, the
  gradient costs several times the value (over 5×; the write-up: 6.5×).
* **Value-and-gradient costs about the value** for every jitted route: the gradient rides
  along with the pass that computes the value.
* **What to call.** For fitting, `fusedlp.poisson_lpmf(..., normalized=False)` (it drops
  the constant −log c!) gives value and gradient 4–6× faster than autodiff of
  `jax.scipy.stats` from n = 10⁴ up in this run. The normalized kernel, which computes
  log c! and the rate terms in a form that stays accurate for large counts, is faster than
  it at n = 10⁴–10⁵ (1.2–1.5× in this run); at 10⁶ its time changes from run to run (1.8×
  in this run, 0.9× in one before it), as the first-touch page faults of its
  temporaries come and go (the allocator note in docs/performance.md).
  If only the gradient is wanted, `jax.grad` of `jax.scipy.stats`, NumPyro and fusedlp
  cost the same within a few per cent at every n: the gradient needs no log c!.
  At n = 1000 every jitted gradient sits near JAX's dispatch floor (about 7 µs on this VM);
  un-jitted, the same calls cost from over 10× (the value) to about a thousand times more
  (fusedlp's gradient, whose accurate log c! is many small operations, and over 10,000×
  at n = 10⁴: always `jit` it).
* The numba loop that calls `lgamma` per element costs 0.7–1.3× the `jax.scipy.stats`
  value from n = 10⁴ in this run; without log c! it is as fast as fusedlp's
  `normalized=False` kernel at n = 10⁴ and 1.7–2× slower from 10⁵, where XLA vectorises
  and uses both cores.
""",
        "claims": """
ns = studies_sizes
claim("jitted jax.grad of jax.scipy.stats costs under half its value at every n (no lgamma)",
      all(median(result, n, "grad") < 0.5 * median(result, n, "value") for n in ns))
claim("jax.scipy.stats value_and_grad costs at most 1.2x its value at every n",
      all(median(result, n, "vg") <= 1.2 * median(result, n, "value") for n in ns))
claim("fusedlp normalized value_and_grad is faster than jax.scipy.stats', n = 10^4 and 10^5",
      None if 10**4 not in ns else all(median(result, n, "fused_vg") < median(result, n, "vg")
                                      for n in ns if 10**4 <= n <= 10**5))
claim("normalized=False value_and_grad is over 3x faster than jax.scipy.stats', n >= 10^4",
      all(median(result, n, "vg") > 3 * median(result, n, "propto_vg") for n in ns
          if n >= 10**4))
claim("un-jitted, the gradient costs over 5x the un-jitted value at n = 1000 (write-up: 6.5x)",
      median(result, 1000, "grad_eager") > 5 * median(result, 1000, "value_eager"))
claim("fusedlp's gradient is within 10% of jitted jax.grad of jax.scipy.stats at every n",
      all(abs(median(result, n, "fused") / median(result, n, "grad") - 1) <= 0.1 for n in ns))
""",
    },
]
