"""A monitor callback that keeps a 1 MiB tensor alive every step: a deliberate slow leak."""
import numpy as np
from mindspore import Tensor


def factory(cfg):
    kept = []

    def keep_tensors_alive(row):
        kept.append(Tensor(np.random.rand(2**18).astype(np.float32)))
        return None
    return keep_tensors_alive
