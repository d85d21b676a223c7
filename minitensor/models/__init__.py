from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.models.slice import GPTSlice

__all__ = ["BERT", "BertConfig", "GPT", "GPTConfig", "GPTSlice"]
