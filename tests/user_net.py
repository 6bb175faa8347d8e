"""A user's own network for the `model.build` test: a bigram model (embedding → logits)."""
from mindspore import nn


class Bigram(nn.Cell):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def construct(self, idx):
        return self.table(idx)


def build(model_cfg, vocab_size):
    return Bigram(vocab_size)
