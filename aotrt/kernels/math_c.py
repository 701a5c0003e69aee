"""The cpu kernels' float math in C (math_c.h): exp, tanh and erf without libm calls, so
that a loop using them vectorises (rendered into every cpu kernel library by
render_c.CRenderer, and into the cpu device's attention and Winograd sources)."""

from aotrt.sources import source

#: float exp, tanh and erf for the cpu, in straight-line arithmetic and selects (no calls,
#: no branches, no lookup tables): the compiler vectorises a loop that uses them. All built
#: from IEEE add/mul/div (-ffp-contract=off keeps them unfused), so a lane and the scalar
#: code agree bit for bit. exp: Cephes' expf (range reduction by ln 2 in two parts, a
#: degree-6 polynomial, the power of two applied in two halves so that subnormal results
#: round once), about 1 ulp. tanh: Cephes' tanhf (an odd polynomial below 0.625, else
#: 1 - 2 / (exp(2|x|) + 1)), about 2 ulp. erf: Cephes' erff polynomial below 1, else
#: Abramowitz & Stegun 7.1.26 (absolute error under 1.5e-7, a few ulp of erf's value there).
#: tests/kernels/test_render_c.py checks them against float64 over their whole range.
MATH_C = source(__package__, "math_c.h")

__all__ = ["MATH_C"]
