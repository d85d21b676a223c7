"""The engine's error classes: each is the Python class a reader expects AND PyTorch's.

PyTorch raises RuntimeError for a shape that does not fit, a dtype it will not mix or an
index past the end of a gather; Python code expects ValueError, TypeError and IndexError.
Each class below is both (multiple inheritance), so `except ValueError` and PyTorch-style
`except RuntimeError` both catch it, and the message stays the engine's one line.
"""


class ShapeError(ValueError, RuntimeError):
    """Shapes that do not fit: broadcasting, matmul, reshape, cat/stack, gather/scatter."""


class DTypeError(TypeError, RuntimeError):
    """Dtypes an op will not mix or does not take (float32 with float64, bitwise on floats)."""


class IndexRangeError(IndexError, RuntimeError):
    """An index entry outside its dim (gather, scatter, embedding): PyTorch's RuntimeError."""


class DivisionByZero(ZeroDivisionError, RuntimeError):
    """An integer divided by zero (div with a rounding mode): PyTorch's RuntimeError."""
