"""Whole numbers read exactly from what a user typed: '9007199254740993' is itself (through
float() it had become 9007199254740992, the nearest double), '1e9' and '1.5K' are whole, and
'1.0000000000000001' is not (float() had read it as 1)."""
from __future__ import annotations

from decimal import Decimal, Inexact, InvalidOperation, localcontext

MAX_DIGITS = 400  # a larger number is a typo (1e999999999 would take minutes to write out)


def exact_whole(text, scale: int = 1) -> int:
    """int(text * scale), computed exactly in decimal: ValueError when text is not a finite
    decimal number ('3/2', 'nan', 'inf') or the product is not whole; OverflowError when it has
    more than MAX_DIGITS digits."""
    try:
        d = Decimal(str(text).strip())
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not d.is_finite():
        raise ValueError(f"not a finite number: {text!r}")
    if d and d.adjusted() + len(str(scale)) > MAX_DIGITS:
        raise OverflowError(f"more than {MAX_DIGITS} digits: {text!r}")
    with localcontext() as ctx:  # enough digits for the product, and none may be lost
        ctx.prec = len(d.as_tuple().digits) + len(str(scale)) + 2
        ctx.Emin, ctx.Emax = -10 * MAX_DIGITS, 10 * MAX_DIGITS
        ctx.traps[Inexact] = True
        try:
            value = d * scale
        except (Inexact, InvalidOperation):  # far below 1 (1e-5000): not whole
            raise ValueError(f"not a whole number: {text!r}") from None
        if value != value.to_integral_value():
            raise ValueError(f"not a whole number: {text!r}")
        return int(value)
