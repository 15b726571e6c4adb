"""Write a tiny random-weight llama-architecture GGUF for the real-peer tier's llama-server.

Run as a script, with llama.cpp's own ``gguf-py`` (the copy vendored beside the server's sources, so the file's
format is the one this server reads) on ``PYTHONPATH`` and numpy installed::

    python tiny_model.py VOCAB.gguf OUT.gguf

The tokenizer (its tokens, scores, types and special ids) is copied from one of llama.cpp's own vocab files;
the weights are seeded noise, so the model answers in milliseconds on one core with text that means nothing.
A chat template (ChatML) is set, since llama-server renders chat messages through the model's template.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

#: Sizes: small enough that a token costs well under a millisecond on one core, large enough to be a model
#: (two blocks, grouped-query attention), so llama-server takes every code path a real one takes.
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX_TRAIN = 4096
SEED = 20261201

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _copy_tokenizer(vocab: Any, writer: Any) -> int:
    """Copy every ``tokenizer.*`` field of the vocab file; return the vocabulary's size."""
    size = 0
    for name, field in vocab.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main = field.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            if name == "tokenizer.ggml.tokens":
                size = len(values)
            writer.add_key_value(name, values, main, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), main)
    if not size:
        raise SystemExit("tiny_model: the vocab file has no tokenizer.ggml.tokens")
    return size


def main(vocab_path: str, out_path: str) -> None:
    vocab = gguf.GGUFReader(vocab_path)
    out = Path(out_path)
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("llmchat-tiny")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_file_type(0)  # all F32
    n_vocab = _copy_tokenizer(vocab, writer)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(SEED)
    kv = N_EMBD // N_HEAD * N_HEAD_KV

    def weight(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)  # never a half-written model under the name the server is started with


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: tiny_model.py VOCAB.gguf OUT.gguf")
    main(sys.argv[1], sys.argv[2])
