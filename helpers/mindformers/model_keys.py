"""`model.*` keys of a MindFormers YAML, in both schemas, mapped onto `model.*` of the workbook.

The legacy schema (`model.model_config.type: LlamaConfig`, `num_layers`, `num_heads`, `n_kv_heads`) and the mcore
one (`use_legacy: False`, Hugging Face names: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
`model_type`) share `model.model_config`; their names differ, so one table holds both. The key lists come from the
YAMLs under `configs/` and `research/` of mindspore-lab/mindformers (master of 2026-01-15 and release 1.5.0).
"""
from __future__ import annotations

from typing import Any

from helpers.mindformers.values import (NULL, Refused, at_least, compute_dtype, flag, nothing, off, one_process,
                                       only, positive, to, unless_none)

M = "model.model_config."

_LLAMA = {"model.norm": "rmsnorm", "model.mlp": "swiglu", "model.bias": False, "model.positions": "rope",
          "model.tie_head": False}
_GPT2 = {"model.norm": "layernorm", "model.mlp": "gelu_tanh", "model.bias": True, "model.positions": "learned",
         "model.tie_head": True, "mf.family": "gpt2"}
# Legacy model_config.type → the workbook's cells. GLM applies rotary to half of each head (mf.rotary_fraction).
FAMILIES: dict[str, dict] = {
    "LlamaConfig": _LLAMA, "InternLM2Config": _LLAMA, "TelechatConfig": _LLAMA, "DeepseekV2Config": _LLAMA,
    "DeepseekV3Config": _LLAMA, "GPT2Config": _GPT2,
    "ChatGLM2Config": {**_LLAMA, "model.qkv_bias": True, "mf.rotary_fraction": 0.5},
}
# mcore model_type (Hugging Face's) → the same.
MODEL_TYPES: dict[str, dict] = {
    "llama": _LLAMA, "qwen2": {**_LLAMA, "model.qkv_bias": True}, "qwen3": {**_LLAMA, "model.qk_norm": True},
    "qwen3_moe": {**_LLAMA, "model.qk_norm": True}, "deepseek_v3": _LLAMA, "telechat3": _LLAMA,
    "glm4": {**_LLAMA, "model.qkv_bias": True, "mf.rotary_fraction": 0.5},
    "glm4_moe": {**_LLAMA, "mf.rotary_fraction": 0.5}, "gpt2": _GPT2,
}
_NOT_AN_LM = ("the workbook trains decoder-only language models of the LLaMA, Qwen, GLM, InternLM2, TeleChat, "
              "DeepSeek and GPT-2 families; start from one of their recipes")


def _family(v: Any) -> dict:
    if v not in FAMILIES:
        raise Refused(f"{v} is not one of the model families the import maps ({', '.join(FAMILIES)}): "
                      f"{_NOT_AN_LM}")
    return dict(FAMILIES[v])


def _model_type(v: Any) -> dict:
    if v not in MODEL_TYPES:
        raise Refused(f"model_type {v!r} is not one the import maps ({', '.join(MODEL_TYPES)}): {_NOT_AN_LM}")
    return dict(MODEL_TYPES[v])


def arch_class(v: Any) -> dict:
    """model.arch.type must name a causal language model head."""
    if not isinstance(v, str) or not v.endswith(("ForCausalLM", "LMHeadModel", "ChatGLM2ForConditionalGeneration")):
        raise Refused(f"{v} is not a causal language model head (…ForCausalLM): {_NOT_AN_LM}")
    return {}


def _hidden_act(v: Any) -> dict:
    if v not in ("silu", "swiglu", "fusedswiglu", "gelu", "fast_gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise Refused("hidden_act must be silu/swiglu (LLaMA), gelu (GPT-2) or relu")
    return {"mf.hidden_act": v}


def _positions(v: Any) -> dict:
    kinds = {"rope": "rope", "learned_absolute": "learned", "absolute": "learned"}
    if v not in kinds:
        raise Refused(f"position_embedding_type must be one of {', '.join(kinds)}")
    return {"model.positions": kinds[v]}


def _norm_kind(v: Any) -> dict:
    return {"model.norm": "rmsnorm" if v in (True, "True", "true") else "layernorm"}


def _rotary_fraction(v: Any) -> dict:
    return {} if v in (None, 1, 1.0) else {"mf.rotary_fraction": float(v)}


def experts(v: Any) -> dict:
    """More than one expert is a mixture of experts: refused at full size, one dense MLP under --scale."""
    if v not in (None, 0, 1):
        raise Refused("mixture of experts is not in the workbook's model (one dense MLP per block); import with "
                      "--scale PRESET for a dense CPU try-out", reduced="one dense MLP per block (no experts)")
    return {}


def _latent_attention(v: Any) -> dict:
    if v not in (None, 0, False, "None"):
        raise Refused("multi-head latent attention (compressed k,v) is not in the workbook's model; import with "
                      "--scale PRESET for a try-out with ordinary attention",
                      reduced="ordinary multi-head attention (no latent k,v)")
    return {}


def _multi_token(v: Any) -> dict:
    if v not in (None, 0):
        raise Refused("multi-token prediction (extra next-n heads) is not in the workbook; import with --scale "
                      "PRESET for a try-out predicting the next token only", reduced="next-token loss only")
    return {}


_GENERATION = (nothing, "a generation setting (inference)")
_LAYOUT = (nothing, "an Ascend kernel, fusion or weight-layout option: same math, no effect on CPU")
_TOKEN_IDS = (nothing, "a token id of the tokenizer (the workbook's loss counts every token)")
_ONE_DROPOUT = (nothing, "the workbook has one dropout rate, model.dropout (from the hidden dropout)")
_KEPT_FP32 = (nothing, "weights stay float32 here; AMP casts the compute (compute_dtype)")
_MOE_DETAIL = (nothing, "a mixture-of-experts setting; see num_experts / n_routed_experts")
_MLA_DETAIL = (nothing, "a multi-head latent attention size; see kv_lora_rank")
_CLASS_LOOKUP = (nothing, "where MindFormers finds its classes; the workbook's model is helpers/run/model.py")
_INIT = (nothing, "the workbook initialises its own way (helpers/run/model.py); only a fresh run's first steps "
                  "differ")

# source key (below model.model_config) → (converter, note for the table)
MODEL_KEYS: dict[str, tuple] = {
    # what the model is
    "type": (_family, "norm, MLP, biases, positions and head of the family"),
    "model_type": (_model_type, "mcore: the family by its Hugging Face model_type"),
    "architectures": (nothing, "named by model_type"),
    "auto_register": _CLASS_LOOKUP, "auto_map.AutoConfig": _CLASS_LOOKUP, "auto_map.AutoModel": _CLASS_LOOKUP,
    "auto_map.AutoTokenizer": _CLASS_LOOKUP,
    # sizes: legacy | mcore names
    "seq_length": (to("model.seq_len", int), ""),
    "hidden_size": (to("model.d_model", int), ""),
    "num_layers": (to("model.n_layer", int), ""), "num_hidden_layers": (to("model.n_layer", int), ""),
    "num_heads": (to("model.n_head", int), ""), "num_attention_heads": (to("model.n_head", int), ""),
    "n_kv_heads": (unless_none("model.n_kv_head", int), "grouped-query attention; null = one k,v per head"),
    "num_key_value_heads": (unless_none("model.n_kv_head", int), "grouped-query attention"),
    "multi_query_attention": (flag("mf.mqa"), "GLM: grouped-query attention when true"),
    "multi_query_group_num": (to("mf.mqa_groups", int), "GLM: key/value heads"),
    "vocab_size": (to("model.vocab_size", int), ""), "padded_vocab_size": (to("model.vocab_size", int), ""),
    "intermediate_size": (unless_none("model.mlp_hidden", int), ""),
    "ffn_hidden_size": (unless_none("model.mlp_hidden", int), ""),
    "expand_ratio": (at_least("mf.expand_ratio", 1), "GPT-2: MLP width = expand_ratio × hidden_size"),
    "multiple_of": (at_least("mf.multiple_of", 1), "LLaMA's SwiGLU width: ⌈(2/3·4·hidden_size × "
                                                   "ffn_dim_multiplier) / multiple_of⌉ × multiple_of, unless "
                                                   "intermediate_size names it"),
    "ffn_dim_multiplier": (positive("mf.ffn_dim_multiplier"), "see multiple_of"),
    "head_dim": (unless_none("mf.head_dim", int), "must be hidden_size / num_attention_heads here"),
    "kv_channels": (unless_none("mf.head_dim", int), "head size; must be hidden_size / num_heads here"),
    "embedding_size": (nothing, "TeleChat's embedding multiplier layout option"),
    # cells
    "hidden_act": (_hidden_act, "silu/swiglu → SwiGLU; gelu → GPT-2's tanh GELU (MindSpore's nn.GELU default)"),
    "gated_linear_unit": (lambda v: {"model.mlp": "swiglu"} if v else {}, "gated MLP = SwiGLU"),
    "rms_norm_eps": (to("model.rms_eps", float), ""), "layernorm_epsilon": (to("model.rms_eps", float), ""),
    "rmsnorm": (_norm_kind, "GLM: RMSNorm when true"),
    "post_layer_norm": (only((True, None), "a final norm before the head is the workbook's only layout"),
                        "a final norm before the head, as here"),
    "apply_residual_connection_post_layernorm": (
        off("apply_residual_connection_post_layernorm (the residual taken after the norm)"), "pre-norm residual"),
    "qkv_has_bias": (flag("model.qkv_bias"), "bias on q, k, v"), "add_qkv_bias": (flag("model.qkv_bias"), ""),
    "attention_bias": (flag("model.qkv_bias"), "bias on q, k, v (Qwen3/LLaMA put it on the output too; here "
                                               "only with add_bias_linear)"),
    "add_bias_linear": (flag("model.bias"), "bias in every Dense"), "has_bias": (flag("model.bias"), ""),
    "out_proj_has_bias": (only((False, None), "a bias on the attention output alone is not in the model; "
                                              "add_bias_linear puts one on every Dense"), ""),
    "wo_has_bias": (only((False, None), "a bias on the attention output alone is not in the model"), ""),
    "tie_word_embeddings": (flag("model.tie_head"), "output head tied to the token embedding"),
    "untie_embeddings_and_output_weights": (flag("model.tie_head", invert=True), ""),
    "qk_layernorm": (flag("model.qk_norm"), "RMS-normalised q and k (here without a learned gain: equal at init)"),
    "position_embedding_type": (_positions, ""),
    "theta": (to("model.rope_theta", float), ""), "rope_theta": (to("model.rope_theta", float), ""),
    "rotary_emb_base": (to("model.rope_theta", float), ""),
    "rope_ratio": (to("mf.rope_ratio", float), "GLM: rotary base = 10000 × rope_ratio"),
    "rotary_pct": (_rotary_fraction, "share of each head that turns; 1.0 here"),
    "extend_method": (to("mf.extend_method"), "PI → linear rope scaling by scaling_factor; None → none"),
    "scaling_factor": (lambda v: {"mf.scaling_factor": v}, "with extend_method"),
    "rotary_scaling_factor": (only((None, 1, 1.0), "rotary scaling other than 1 needs extend_method"), ""),
    "pretrain_seqlen": (nothing, "the pre-training context (with extend_method)"),
    "max_position_embeddings": (nothing, "positions cover model.seq_len"),
    "max_position_embedding": (nothing, "positions cover model.seq_len"),
    "use_rope_slice": _LAYOUT, "use_fused_rope": _LAYOUT, "apply_rope_fusion": _LAYOUT,
    # dropout
    "hidden_dropout_prob": (to("model.dropout", float), ""), "hidden_dropout": (to("model.dropout", float), ""),
    "hidden_dropout_rate": (to("model.dropout", float), ""),
    "attention_dropout_prob": _ONE_DROPOUT, "attention_dropout": _ONE_DROPOUT, "attention_dropout_rate": _ONE_DROPOUT,
    "attention_probs_dropout_prob": _ONE_DROPOUT, "emb_dropout_prob": _ONE_DROPOUT,
    "embed_dropout_prob": _ONE_DROPOUT, "embedding_dropout_prob": _ONE_DROPOUT,
    # precision
    "compute_dtype": (compute_dtype, "float16/bfloat16 compute on fp32 weights is AMP O2"),
    "layernorm_compute_type": (nothing, "norms run in float32 under AMP here (fp32_cells)"),
    "layernorm_compute_dtype": (nothing, "norms run in float32 under AMP here (fp32_cells)"),
    "softmax_compute_type": (lambda v: {} if v == "float32" else {"fp32_cells": ["layernorm"]},
                             "softmax in fp32 unless float16"),
    "softmax_compute_dtype": (lambda v: {} if v == "float32" else {"fp32_cells": ["layernorm"]}, ""),
    "param_init_type": _KEPT_FP32, "params_dtype": _KEPT_FP32,
    "rotary_dtype": (nothing, "the rotary tables are fp32 here"),
    "res_dtype": (nothing, "the residual stream follows the AMP level here"),
    "residual_dtype": (nothing, "the residual stream follows the AMP level here"),
    "router_dense_type": _MOE_DETAIL, "attention_softmax_in_fp32": (nothing, "softmax is fp32 here"),
    "fp32_residual_connection": (nothing, "the residual stream follows the AMP level here"),
    "apply_query_key_layer_scaling": (nothing, "an fp16 overflow guard of the scores; same math"),
    "use_flash_attention": (lambda v: {"model.attention": "flash" if v else "manual"}, "flash = Ascend only"),
    # initialisation
    "initializer_range": _INIT, "sigma": _INIT, "mean": _INIT,
    "checkpoint_name_or_path": (nothing, "weights come in through init_from (Hugging Face safetensors)"),
    # mixture of experts, latent attention, multi-token prediction, μP
    "num_experts": (experts, ""), "n_routed_experts": (experts, ""), "use_moe": (lambda v: experts(2 if v else 1), ""),
    **{k: _MOE_DETAIL for k in (
        "num_experts_per_tok", "moe_intermediate_size", "moe_grouped_gemm", "moe_router_pre_softmax",
        "moe_token_drop_policy", "routed_scaling_factor", "router_aux_loss_coef", "moe_aux_loss_coeff",
        "moe_router_load_balancing_type", "norm_topk_prob", "moe_router_bias_update_rate",
        "moe_router_enable_expert_bias", "moe_router_force_expert_balance", "moe_router_fusion",
        "moe_shared_expert_intermediate_size", "moe_token_dispatcher_type", "moe_z_loss_coeff", "n_shared_experts",
        "first_k_dense_replace", "scoring_func", "topk_group", "n_group", "use_fused_ops_topkrouter")},
    "multi_latent_attention": (_latent_attention, ""), "kv_lora_rank": (_latent_attention, ""),
    **{k: _MLA_DETAIL for k in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                "mla_qkv_concat", "use_fused_mla", "mscale", "mscale_all_dim", "beta_fast",
                                "beta_slow")},
    "mtp_depth": (_multi_token, ""), "num_nextn_predict_layers": (_multi_token, ""),
    "mtp_loss_factor": (nothing, "the weight of multi-token prediction; see mtp_depth"),
    "use_mup": (off("μP (use_mup)"), ""), "mup_scale_factor": (nothing, "μP; see use_mup"),
    "output_mult": (nothing, "μP; see use_mup"),
    # fine-tuning and inference features
    "use_past": (off("use_past (the inference KV cache)"), "inference only"),
    "use_past_shard": (off("use_past_shard"), "inference only"),
    "pre_seq_len": (only((None, "None", 0), "P-tuning (pre_seq_len) is not in the workbook: set it to None"), ""),
    "prefix_projection": (off("prefix_projection (P-tuning)"), ""),
    "quantization_bit": (only((0, None), "quantization is not in the workbook: set it to 0"), ""),
    "no_recompute_layers": (nothing, "recompute covers every block or none here (recompute_config.recompute)"),
    "eod_reset": (nothing, "documents are not separated in attention here (one causal window)"),
    "use_ring_attention": (lambda v: one_process("use_ring_attention (context parallel)")(2 if v else 1), ""),
    **{k: _GENERATION for k in ("repetition_penalty", "max_decode_length", "top_k", "top_p", "do_sample",
                                "batch_size", "is_dynamic", "use_cache", "block_size", "num_blocks", "num_block",
                                "temperature", "max_length", "use_prompt_flash_attention", "use_pad_tokens", "llm_backend",
                                "boost_model_name",
                                "use_incre_flash_attention", "return_extra_loss", "run_mode")},
    **{k: _TOKEN_IDS for k in ("bos_token_id", "eos_token_id", "pad_token_id", "ignore_token_id")},
    **{k: _LAYOUT for k in (
        "offset", "qkv_concat", "fine_grain_interleave", "embedding_init_type", "fused_rms_norm",
        "use_fused_swiglu", "parallel_optimizer", "pp_interleave_num", "mlp_concat", "ffn_concat", "compute_in_2d",
        "bias_dropout_fusion", "bias_swiglu_fusion", "use_attn_mask_compression", "input_sliced_sig",
        "use_contiguous_weight_layout", "use_contiguous_weight_layout_attention", "layers_group", "net_name",
        "npu_nums_per_device")},
}
ARCH_KEYS = {"model.arch.type": (arch_class, "the workbook's decoder (helpers/run/model.py)")}
MODEL_SECTIONS = {
    "pet_config": "parameter-efficient fine-tuning (LoRA, prefix tuning)",
    "quantization_config": "quantized inference",
}


def pet_type(v: Any) -> dict:
    """LoRA and prefix tuning train a few added weights; the workbook trains them all."""
    if v not in NULL:
        raise Refused(f"parameter-efficient fine-tuning ({v}) is not in the workbook: remove model_config.pet_config "
                      f"to fine-tune every weight")
    return {}


def quantized(v: Any) -> dict:
    """A quantization config describes quantized inference."""
    raise Refused("quantization_config is for quantized inference; the workbook trains in fp32/AMP: remove it")
