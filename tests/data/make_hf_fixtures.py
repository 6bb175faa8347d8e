"""Tiny Hugging Face checkpoints saved by transformers itself, with the logits transformers computes on fixed token
ids, for tests/run/test_hf_fixtures.py; and the check that the workbook's export of them loads back in transformers.

Needs torch and transformers, which the workbook does not depend on: run it from a throwaway venv, e.g.
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers numpy safetensors
    /tmp/hfvenv/bin/python tests/data/make_hf_fixtures.py make
    /tmp/hfvenv/bin/python tests/data/make_hf_fixtures.py check --workbook-python .venv/bin/python

make: each fixture folder under tests/data/hf_fixtures/ gets config.json and model.safetensors (save_pretrained) and
logits.npy (float32 [batch·seq, vocab]) on IDS. Every parameter is drawn at std 0.2 (biases and norm gains too,
which transformers would start at 0 and 1), so that a wrong theta, scaling or bias moves the logits visibly.
check: the workbook imports each fixture and exports it again (tests/run/test_hf_fixtures.export_all, in the
workbook's venv); transformers loads each export, and the largest logit difference from the fixture's is written
to tests/data/hf_fixtures/roundtrip_check.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "hf_fixtures"
REPO = HERE.parents[2]
IDS = np.random.default_rng(11).integers(0, 64, (2, 12)).astype(np.int64)
STD = 0.2
DIMS = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "initializer_range": STD, "rms_norm_eps": 1e-6}
FIXTURES = {
    # grouped-query attention: 4 q heads share 2 k,v heads; a head of its own
    "llama_gqa": ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": False}),
    # transformers 5 writes the rotary base inside rope_parameters only
    "llama_rope_parameters": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": False,
                                        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
    # linear rope scaling, one k,v head
    "llama_linear_rope": ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": False,
                                    "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}),
    # Qwen2: q,k,v bias, tied head, theta 1e6
    "qwen2": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
}


def _model(kind: str, settings: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    return model_cls(config_cls(**DIMS, **settings)).to(torch.float32).eval()


def logits_of(model) -> np.ndarray:
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(IDS)).logits
    return out.reshape(-1, out.shape[-1]).numpy().astype(np.float32)


def make() -> None:
    import torch
    for i, (name, (kind, settings)) in enumerate(FIXTURES.items()):
        torch.manual_seed(100 + i)
        model = _model(kind, settings)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                p.copy_(torch.randn_like(p) * STD + (1.0 if "norm" in pname else 0.0))
        folder = HERE / name
        model.save_pretrained(folder)
        (folder / "generation_config.json").unlink(missing_ok=True)
        np.save(folder / "logits.npy", logits_of(model))
        print(name, sorted(p.name for p in folder.iterdir()), sum(p.stat().st_size for p in folder.iterdir()))
    np.save(HERE / "ids.npy", IDS.astype(np.int32))


def check(workbook_python: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([workbook_python, "-c", "import sys; from tests.run.test_hf_fixtures import export_all; "
                        "export_all(sys.argv[1])", out], cwd=REPO, check=True)
        diffs = {}
        for name in FIXTURES:
            model = AutoModelForCausalLM.from_pretrained(Path(out) / name, dtype=torch.float32).eval()
            diffs[name] = float(np.abs(logits_of(model) - np.load(HERE / name / "logits.npy")).max())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "helpers"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip())
    result = {"what": "each fixture imported into the workbook's model and exported again (write_checkpoint), then "
                      "loaded by transformers AutoModelForCausalLM: the largest |logit difference| from the "
                      "fixture's own logits on ids.npy",
              "transformers": transformers.__version__, "torch": torch.__version__,
              "workbook_commit": commit + (" (helpers/ modified)" if dirty else ""),
              "max_abs_logit_diff": diffs, "passed": all(d < 1e-4 for d in diffs.values())}
    (HERE / "roundtrip_check.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make", help="write the fixtures")
    checker = sub.add_parser("check", help="export each fixture with the workbook and load it back in transformers")
    checker.add_argument("--workbook-python", required=True, help="the workbook venv's python (.venv/bin/python)")
    args = parser.parse_args()
    make() if args.command == "make" else check(args.workbook_python)
