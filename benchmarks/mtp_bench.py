"""`--speculative mtp` on a random-weight Qwen3.5-0.8B-shaped folder with an MTP head: what the head and
its verify steps cost, and what a head that agreed with the model would gain.

Random weights: the head's drafts are noise (about 1 in the vocabulary is kept), so `mtp` here measures
the cost side: each step one batched head pass over the new target rows plus k - 1 one-row passes (each
with the 248k-row LM head), and a verify step of k + 1 positions whose drafts are all rejected, until the
back-off (engine/speculative.py) stops proposing. `replay` is the gain side without a trained head: the
same verify steps with drafts taken from the plain run's own output (every draft kept), as
hybrid_spec_bench.py does; a trained head lands between the two.

Rounds alternate plain, mtp and replay (one stream, greedy, the same prompt ids); each line reports decode
tok/s, drafts kept and the head's time per proposing call.

python benchmarks/mtp_bench.py --folder /tmp/qwen35-08b-mtp   (built there on the first run, ~1.7 GB)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.hybrid_spec_bench import ReplayProposer
from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig

# Qwen3.5-0.8B's text config as published (tied embeddings, 248,320 tokens).
SHAPE: dict[str, Any] = dict(
    vocab_size=248_320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=262_144,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=True, mtp_num_hidden_layers=1,
)  # fmt: skip


def build(folder: Path) -> None:
    """transformers' Qwen3.5 with its own initialisation (bf16), plus `mtp.*` tensors drawn the same way
    (std 0.02 matrices, zero-centred norms), and a token-id tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**SHAPE)).bfloat16()
    model.save_pretrained(folder)
    hidden = SHAPE["hidden_size"]
    mtp: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        if name.startswith("model.layers.3."):  # a full-attention layer: the MTP layer's names and shapes
            std = 0.0 if name.endswith("norm.weight") else 0.02
            mtp["mtp.layers.0." + name.removeprefix("model.layers.3.")] = std * torch.randn_like(value)
    mtp["mtp.fc.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, dtype=torch.bfloat16)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
    del model
    files = sorted(folder.glob("model*.safetensors"))
    last = files[-1]
    save_file(
        {**load_file(str(last)), **{k: v.contiguous() for k, v in mtp.items()}}, str(last), {"format": "pt"}
    )
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"].update({k: last.name for k in mtp})
        index.write_text(json.dumps(data))
    vocab = {f"t{i}": i for i in range(SHAPE["vocab_size"])}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())


def decode(engine: LLMEngine, ids: list[int], tokens: int) -> tuple[list[int], float]:
    """Greedy decode of `tokens` after `ids`: (tokens, decode tok/s after the first token)."""
    engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    out: list[int] = []
    first = 0.0
    while engine.has_unfinished:
        for o in engine.step():
            if o.new_token_ids and not out:
                first = time.perf_counter()
            out += o.new_token_ids
    return out, (len(out) - 1) / (time.perf_counter() - first)


def timed(proposer: Any) -> list[float]:
    """Seconds of every proposing call from now on."""
    times: list[float] = []
    propose = proposer.propose

    def wrapped(wanted: Any, live: set[str]) -> dict[str, list[int]]:
        start = time.perf_counter()
        try:
            return propose(wanted, live)
        finally:
            times.append(time.perf_counter() - start)

    proposer.propose = wrapped
    return times


def compare(llms: dict[str, LLM], ids: list[int], tokens: int, rounds: int, plain: list[int]) -> None:
    """Alternate the engines round by round (so the ratios come from one stretch of machine load), print
    each round's rate, drafts kept and equality with plain decoding, then the medians and the MTP head's
    time per proposing call (`llms["mtp"]`'s proposer)."""
    head_times = timed(llms["mtp"].engine.scheduler.proposer)
    rates: dict[str, list[float]] = {name: [] for name in llms}
    for r in range(rounds):
        for name, llm in llms.items():
            eng = llm.engine
            drafted, kept = eng.spec_draft_tokens, eng.spec_accepted_tokens
            out, rate = decode(eng, ids, tokens)
            rates[name].append(rate)
            print(
                f"round {r} {name:6s} {rate:6.2f} tok/s  drafts kept {eng.spec_accepted_tokens - kept}"
                f"/{eng.spec_draft_tokens - drafted}  equal plain: {out == plain}",
                flush=True,
            )
    for name, values in rates.items():
        print(f"{name:6s} median {statistics.median(values):.2f} tok/s")
    if head_times:
        print(
            f"MTP head: {len(head_times)} proposing calls, median {1000 * statistics.median(head_times):.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, default=Path("/tmp/qwen35-08b-mtp"))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-mib", type=int, default=1024)
    args = parser.parse_args()
    if not (args.folder / "tokenizer.json").is_file():
        args.folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        build(args.folder)
        print(f"built {args.folder} in {time.perf_counter() - started:.0f}s", flush=True)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100_000, size=40)]

    def loaded(method: str) -> LLM:
        spec = SpeculativeConfig(method, num_tokens=args.k)
        config = EngineConfig(kv_cache_mib=args.kv_mib, speculative=spec)
        return LLM(args.folder, backend="torch", dtype=args.dtype, engine_config=config)

    plain_llm, mtp_llm = loaded("off"), loaded("mtp")
    plain, _ = decode(plain_llm.engine, ids, args.tokens)
    replay_llm = loaded("ngram")  # its verify steps, with the replayed drafts
    replay_llm.engine.scheduler.proposer = ReplayProposer(plain, None, SHAPE["vocab_size"])
    compare({"plain": plain_llm, "mtp": mtp_llm, "replay": replay_llm}, ids, args.tokens, args.rounds, plain)


if __name__ == "__main__":
    main()
