"""AMP dtype audit: which cells really compute in fp16 / fp32 after an AMP level is applied.

MindSpore's AMP rewrites casts around cells; what a config asks for and what runs can differ (the O2
black list keeps LayerNorm in fp32 but not Softmax). The audit runs one PyNative forward pass of a fresh
copy of the model with forward hooks on every leaf cell and reads the dtype each cell outputs.
"""
from __future__ import annotations

from contextlib import chdir
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from helpers.config import Config

# The cell kinds each `fp32_cells` name protects, by class name (RMSNorm is ours).
PROTECTED_KINDS = {"layernorm": ("LayerNorm", "RMSNorm"), "softmax": ("Softmax",)}
PROTECTABLE = {kind for kinds in PROTECTED_KINDS.values() for kind in kinds}


@dataclass
class AuditRow:
    """One leaf cell (or the logits / loss) and the dtype it computes in."""
    name: str
    kind: str
    input_dtype: str
    compute_dtype: str
    protected: bool
    ok: bool


def _short(dtype) -> str:
    return {"Float16": "fp16", "Float32": "fp32", "BFloat16": "bf16", "Int32": "int32"}.get(str(dtype), str(dtype))


def dtype_audit(cfg: Config, vocab_size: int, kernels: str, folder: Path) -> list[AuditRow]:
    """Run the audit for `cfg` with the run's resolved `kernels` (`kernels.resolve_kernels`); switches MindSpore to
    PyNative for the pass and back to cfg.mode. `folder`: the run's, for AMP's rewritten source (`apply_precision`)."""
    import mindspore as ms
    from helpers.run.model import build_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        raw = build_model(cfg, vocab_size, kernels)
        net = apply_precision(raw, cfg, folder)
        wanted = {k for name in cfg.fp32_cells for k in PROTECTED_KINDS[name]}
        rows, handles = [], []

        def hook(name, kind=None):
            def record(cell, inputs, output):
                kind_ = kind or type(cell).__name__
                first = next((i for i in inputs if hasattr(i, "dtype")), None)
                compute = _short(output.dtype)
                protected = kind_ in wanted
                rows.append(AuditRow(name, kind_, _short(first.dtype) if first is not None else "-", compute,
                                     protected, compute == "fp32" if protected else True))
            return record

        for name, cell in raw.cells_and_names():
            # leaf cells: where the arithmetic happens; and protected kinds that wrap an inner function (the
            # hand-written-backward LayerNorm, model.norm_backward=manual), whose output is what must be fp32
            if not cell._cells or type(cell).__name__ in PROTECTABLE:
                handles.append(cell.register_forward_hook(hook(name or type(cell).__name__)))
        handles.append(raw.register_forward_hook(hook("logits (lm head)", "MatMul")))
        x = ms.Tensor(np.zeros((1, cfg.model.seq_len), np.int32))
        net(x)
        for handle in handles:
            handle.remove()
        rows.append(AuditRow("loss", "SoftmaxCrossEntropyWithLogits", rows[-1].compute_dtype, "fp32", False, True))
        return rows
    finally:
        ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE)


def audit_summary(rows: list[AuditRow]) -> dict:
    """{'fp16': [kinds], 'fp32': [kinds], 'unprotected': [cell names asked for fp32 but computing lower]}."""
    by_dtype: dict[str, list[str]] = {}
    for row in rows:
        kinds = by_dtype.setdefault(row.compute_dtype, [])
        if row.kind not in kinds:
            kinds.append(row.kind)
    return {**by_dtype, "unprotected": [r.name for r in rows if not r.ok]}


def rows_as_dicts(rows: list[AuditRow]) -> list[dict]:
    """Rows for JSON / DataFrame display."""
    return [asdict(r) for r in rows]


def apply_precision(backbone, cfg: Config, folder: Path):
    """AMP level on the backbone, then the configured cells forced back to fp32. MindSpore's AMP writes the network's
    rewritten source to ./rewritten_network and compiles from it: `folder` (the run's) is that '.', so the source
    stays with the run instead of littering wherever the process started."""
    if cfg.amp_level == "O0":
        return backbone
    import mindspore as ms
    from mindspore import amp, nn
    from helpers.run.model import RMSNorm
    dtype = {"fp16": ms.float16, "bf16": ms.bfloat16}[cfg.amp_dtype]
    with chdir(folder):
        backbone = amp.auto_mixed_precision(backbone, cfg.amp_level, dtype=dtype)
    kinds = {"layernorm": (nn.LayerNorm, RMSNorm), "softmax": (nn.Softmax,)}
    protected = tuple(t for name in cfg.fp32_cells for t in kinds[name])
    if protected:
        for _, cell in backbone.cells_and_names():
            if isinstance(cell, protected):
                cell.to_float(ms.float32)
    return backbone
