"""The planner's parameter arithmetic for a workbook config (`model_params`, used to size an imported recipe at full
size) against the parameters of the model really built at small dims."""
from __future__ import annotations

import pytest

from helpers.book.planner import model_params
from helpers.config import from_dict


@pytest.mark.parametrize("knobs", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "bias": False, "positions": "rope"},
                                   {"mlp": "gelu_tanh", "bias": False}, {"mlp": "swiglu", "d_model": 96},
                                   {"mlp": "relu2", "qk_norm": True, "logit_softcap": 30.0}],
                         ids=["gpt", "llama", "gelu_tanh_no_bias", "swiglu_d96", "relu2_levers"])
def test_model_params_is_what_the_model_builds(knobs):
    import mindspore as ms
    from helpers.run.model import GPT, count_params
    ms.set_context(mode=ms.PYNATIVE_MODE)
    m = from_dict({"model": {"preset": "tiny", **knobs}}).model
    assert model_params(m, 77) == count_params(GPT(m, 77, False))
