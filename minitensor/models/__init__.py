from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig

__all__ = ["BERT", "BertConfig", "GPT", "GPTConfig"]
