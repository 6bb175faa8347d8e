"""A user network whose one wide matmul dominates op time (for the compute-bound verdict)."""
from mindspore import nn


class WideMlp(nn.Cell):
    # 4096 wide: MatMul's share of op time stays far above the 45% limit under another worker's load too (at 1024 it
    # read 68% quiet and 38–44% beside the rest of the suite)
    def __init__(self, vocab_size: int, width: int = 4096):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 256)
        self.wide = nn.Dense(256, width)
        self.head = nn.Dense(width, vocab_size)

    def construct(self, idx):
        return self.head(self.wide(self.embed(idx)))


def build(model_cfg, vocab_size):
    return WideMlp(vocab_size)
