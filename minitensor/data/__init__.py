"""Data that needs no download: a generated addition task and char-level text.

    from minitensor.data import AdditionTask, CharDataset, exact_match
"""
from minitensor.data.addition import AdditionTask, exact_match, recommended_config
from minitensor.data.text import CharDataset

__all__ = ["AdditionTask", "CharDataset", "exact_match", "recommended_config"]
