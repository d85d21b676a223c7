"""The README's "The op surface" table is the listing of the engine's ops: every op at the
top of the package (`mt.NAME`) and every named Tensor method appears in it, so the table
says what exists."""
import inspect
import re
from pathlib import Path

import minitensor as mt
from minitensor import methods

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_OPS = {"Function", "Tensor", "nn", "optim", "recompute", "manual_seed", "default_generator", "get_rng_state",
           "set_rng_state", "gradcheck", "no_grad", "enable_grad", "is_grad_enabled"}


def listed_names():
    """Every identifier inside backticks in the README's op-surface section."""
    text = README.read_text()
    section = text.split("## The op surface", 1)[1].split("\n## ", 1)[0]
    return {word for quoted in re.findall(r"`([^`]*)`", section) for word in re.findall(r"[A-Za-z_][\w]*", quoted)}


def test_every_op_and_method_is_in_the_readme_table():
    names = {name for name in mt.__all__ if inspect.isfunction(getattr(mt, name, None)) and name not in NOT_OPS}
    names |= {name for group in methods.METHODS.values() for name in group}
    missing = sorted(names - listed_names())
    assert not missing, f"ops missing from the README's op surface table: {missing}"
