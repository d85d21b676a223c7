"""Range checks of numeric command-line flags, in one message form for every program
(python -m minitensor.bench, parallel.train, parallel.plan, parallel.bench):

    --lr=nan must be a finite number > 0
    --steps=0 must be ≥ 1

A rule is (what the value must be, the test); `bad_flag` returns the message of the first
flag that breaks its rule, for the program to pass to `parser.error` (exit 2, one line).

`DashValueParser` is an ArgumentParser that explains argparse's "expected one argument" when
the value starts with '-' (`--link -1,1e-9` reads as two flags): attach it, `--link=-1,1e-9`.
"""
import argparse
import math
import re
import sys

AT_LEAST_1 = ("≥ 1", lambda v: v >= 1)
AT_LEAST_0 = ("≥ 0", lambda v: v >= 0)
POSITIVE = ("a finite number > 0", lambda v: math.isfinite(v) and v > 0)
NON_NEGATIVE = ("a finite number ≥ 0", lambda v: math.isfinite(v) and v >= 0)


def at_most(high):
    """The rule "≤ high" (printed with thousands separators: ≤ 1,000,000)."""
    return f"≤ {high:,}", lambda v: v <= high


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


class DashValueParser(argparse.ArgumentParser):
    """An ArgumentParser whose "expected one argument", when the flag's value starts with '-',
    says how to pass it: "(a value starting with '-' must be attached: --link=-1,1e-9)"."""

    def parse_known_args(self, args=None, namespace=None):
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        """argparse's error (usage, one line, exit 2), with the hint when it applies."""
        super().error(message + dash_value_hint(message, getattr(self, "argv", [])))


def dash_value_hint(message, argv):
    """The hint " (a value starting with '-' must be attached: --flag=VALUE)" when `message` is
    argparse's "argument --flag: expected one argument" and the word after --flag in argv starts
    with '-'; otherwise ""."""
    match = re.fullmatch(r"argument (\S+): expected one argument", message)
    names = match.group(1).split("/") if match else []
    for word, value in zip(argv, argv[1:]):
        if word in names and value.startswith("-"):
            return f" (a value starting with '-' must be attached: {word}={value})"
    return ""
