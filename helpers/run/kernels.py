"""Native CPU kernels (native/wb_kernels.cc) as MindSpore AOT custom ops, each with its backward.

`make kernels` builds native/build/libwbkernels.so with g++ and records the SHA-256 of the sources it was built
from; a library that is missing or older than the sources is refused in one line (a stale library would run
code that is no longer in the repository). `resolve_kernels(cfg)` is the one rule for `model.kernels`: `auto`
becomes `native` only where the library is usable (on CPU, in fp32, built and current). A run resolves it once
(helpers/run/train.py) and hands the value to the model (`model.build_model`), which never reads the config string.
"""
from __future__ import annotations

import hashlib

from helpers.config import Config, ConfigError
from helpers.paths import REPO_ROOT

NATIVE_DIR = REPO_ROOT / "native"
LIBRARY = NATIVE_DIR / "build" / "libwbkernels.so"
SOURCES_HASH = NATIVE_DIR / "build" / "sources.sha256"
NATIVE, MINDSPORE = "native", "mindspore"  # what resolve_kernels returns


def sources_digest() -> str:
    """SHA-256 (hex) of native/*.cc and *.h concatenated in name order: the same bytes `make kernels` hashes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in NATIVE_DIR.iterdir() if p.suffix in (".cc", ".h")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def library_problem() -> str:
    """'' if the native library is built from the current sources, else why not (one line, with the fix)."""
    if not LIBRARY.is_file():
        return (f"the native kernel library {LIBRARY.relative_to(REPO_ROOT)} is not built; run `make kernels` "
                f"(needs g++)")
    recorded = SOURCES_HASH.read_text().split()[0] if SOURCES_HASH.is_file() else ""
    if recorded != sources_digest():
        return (f"the native kernel library {LIBRARY.relative_to(REPO_ROOT)} is stale (native/ sources changed "
                f"since it was built); run `make kernels`")
    return ""


def resolve_kernels(cfg: Config) -> str:
    """'native' or 'mindspore' for this run. `auto` picks native on CPU in fp32 when the library is current;
    an explicit `native` whose library is missing or stale raises a one-line ConfigError."""
    choice = cfg.model.kernels
    if choice == MINDSPORE:
        return MINDSPORE
    problem = library_problem()
    if choice == NATIVE:
        if problem:
            raise ConfigError(f"model.kernels=native: {problem}; or set model.kernels=mindspore")
        return NATIVE
    usable = cfg.device_target == "CPU" and cfg.amp_level == "O0" and not problem
    return NATIVE if usable else MINDSPORE


def _func(name: str) -> str:
    return f"{LIBRARY}:{name}"


_OPS: dict = {}  # the custom primitives of this process, once built (native_ops)


def _build_ops() -> dict:
    from mindspore import ops

    rows = lambda x: x[:-1]  # noqa: E731  (per-row statistics: every axis but the last)
    ln_bwd = ops.Custom(_func("LayerNormBwd"), out_shape=lambda dy, x, g, m, r: (x, g, g),
                        out_dtype=lambda dy, x, g, m, r: (x, g, g), func_type="aot")

    def ln_bprop(x, gamma, beta, eps, out, dout):
        dx, dgamma, dbeta = ln_bwd(dout[0], x, gamma, out[1], out[2])
        return dx, dgamma, dbeta, ops.zeros_like(eps)

    ln_fwd = ops.Custom(_func("LayerNormFwd"), out_shape=lambda x, g, b, e: (x, rows(x), rows(x)),
                        out_dtype=lambda x, g, b, e: (x, x, x), func_type="aot", bprop=ln_bprop)

    gelu_bwd = ops.Custom(_func("GeluBwd"), out_shape=lambda dy, x: x, out_dtype=lambda dy, x: x, func_type="aot")

    def gelu_bprop(x, out, dout):
        return (gelu_bwd(dout, x),)

    gelu_fwd = ops.Custom(_func("GeluFwd"), out_shape=lambda x: x, out_dtype=lambda x: x, func_type="aot",
                          bprop=gelu_bprop)

    sm_bwd = ops.Custom(_func("CausalSoftmaxBwd"), out_shape=lambda dp, p, s: p, out_dtype=lambda dp, p, s: p,
                        func_type="aot")

    def sm_bprop(scores, scale, out, dout):
        return sm_bwd(dout, out, scale), ops.zeros_like(scale)

    sm_fwd = ops.Custom(_func("CausalSoftmaxFwd"), out_shape=lambda s, c: s, out_dtype=lambda s, c: s,
                        func_type="aot", bprop=sm_bprop)
    bias_bwd = ops.Custom(_func("BiasAddBwd"), out_shape=lambda dy: dy[-1:], out_dtype=lambda dy: dy,
                          func_type="aot")

    def bias_bprop(x, b, out, dout):
        return dout, bias_bwd(dout)

    bias_fwd = ops.Custom(_func("BiasAddFwd"), out_shape=lambda x, b: x, out_dtype=lambda x, b: x,
                          func_type="aot", bprop=bias_bprop)
    bias_gelu_bwd = ops.Custom(_func("BiasGeluBwd"), out_shape=lambda dy, x, b: (x, b),
                               out_dtype=lambda dy, x, b: (x, b), func_type="aot")

    def bias_gelu_bprop(x, b, out, dout):
        dx, db = bias_gelu_bwd(dout, x, b)
        return dx, db

    bias_gelu_fwd = ops.Custom(_func("BiasGeluFwd"), out_shape=lambda x, b: x, out_dtype=lambda x, b: x,
                               func_type="aot", bprop=bias_gelu_bprop)
    return {"layernorm": ln_fwd, "gelu": gelu_fwd, "causal_softmax": sm_fwd, "bias_add": bias_fwd,
            "bias_gelu": bias_gelu_fwd}


def native_ops() -> dict:
    """{'layernorm', 'gelu', 'causal_softmax', 'bias_add', 'bias_gelu'} → Custom primitives (inputs and outputs as
    in native/wb_kernels.cc), built once per process: the library is checked (its sources hashed) on the first
    call only, and a ConfigError then says why it is unusable. Every layer of a model asks for them."""
    if not _OPS:
        problem = library_problem()
        if problem:
            raise ConfigError(f"model.kernels=native: {problem}; or set model.kernels=mindspore")
        _OPS.update(_build_ops())
    return _OPS
