"""Data that needs no download: a generated addition task (also masked, for BERT) and char-level text.

    from minitensor.data import AdditionTask, CharDataset, exact_match
"""
from minitensor.data.addition import AdditionTask, exact_match, recommended_config
from minitensor.data.masked_addition import MaskedAdditionTask, masked_digit_accuracy
from minitensor.data.text import CharDataset

__all__ = ["AdditionTask", "CharDataset", "MaskedAdditionTask", "exact_match", "masked_digit_accuracy",
           "recommended_config"]
