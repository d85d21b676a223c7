"""Range checks of numeric command-line flags, in one message form for every program
(python -m minitensor.bench, parallel.train, parallel.plan, parallel.bench):

    --lr=nan must be a finite number > 0
    --steps=0 must be ≥ 1

A rule is (what the value must be, the test); `bad_flag` returns the message of the first
flag that breaks its rule, for the program to pass to `parser.error` (exit 2, one line).
"""
import math

AT_LEAST_1 = ("≥ 1", lambda v: v >= 1)
AT_LEAST_0 = ("≥ 0", lambda v: v >= 0)
POSITIVE = ("a finite number > 0", lambda v: math.isfinite(v) and v > 0)
NON_NEGATIVE = ("a finite number ≥ 0", lambda v: math.isfinite(v) and v >= 0)


def bad_flag(args, rules):
    """The first "--flag=value must be ..." among rules {dest: rule}, or None. Unset flags
    (None) pass; a list (nargs="+") is checked element by element."""
    for dest, (must_be, holds) in rules.items():
        value = getattr(args, dest)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not holds(v):
                return f"--{dest.replace('_', '-')}={v} must be {must_be}"
    return None


def parse_checked(parser, argv, rules):
    """parser.parse_args(argv), then parser.error (exit 2, one line) on the first flag that
    breaks its rule."""
    args = parser.parse_args(argv)
    message = bad_flag(args, rules)
    if message:
        parser.error(message)
    return args
