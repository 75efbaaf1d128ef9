"""A scripted backend: no weights, byte-level tokens, replies chosen by the prompt.

It still honours the paged-KV contract: it stores every token at its slot and, before sampling, reads
each request's whole context back through its block table. A scheduler or block-manager bug that would
corrupt a real model's context raises here instead. Used by engine, server and UI tests.

Reply script: a prompt containing `<<say:TEXT>>` is answered with TEXT (`\\n` escapes allowed);
otherwise with DEFAULT_REPLY. After the reply comes EOS. `<<slow:MS>>` sleeps MS per step.
The first script in the prompt wins, except that one inside a tool result (a ChatML `tool` turn)
scripts the reply to that result, so tests can play a tool-calling conversation.
With a grammar mask, a scripted token the mask forbids is replaced by the lowest allowed one (and every
row's mask can be recorded, for tests).
With `state_bytes` > 0 it plays a hybrid model too: each state slot holds the tokens its sequence has
fed so far (a recurrent state's stand-in), zeroed for a row at position 0, copied by `state_copies`, and
checked against the row's context every step, so a lost, shared or unrestored state raises.
With `speculate=True` it scores draft tokens too (each position's scripted token; the engine keeps the
drafts that match), and as a hybrid writes each verify row's per-position states into the rows
`state_keep` names (engine/hybrid_spec.py), so a missing or wrong fix-up copy raises the same way.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from localchat.engine.constraint import unpack_bitmask
from localchat.engine.interface import (
    BatchInputs,
    KVCacheSpec,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
    TokenLogprobs,
)
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2  # <|im_end|>
BYTE_OFFSET = len(SPECIAL_TOKENS)
DEFAULT_REPLY = (
    "Hello! I am the **fake** model.\n\nHere is some code:\n\n```python\nprint('hello')\n```\n\n"
    "- one\n- two\n"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SAY = re.compile(r"<<say:(.*?)>>", re.S)
_SLOW = re.compile(r"<<slow:(\d+)>>")


def _script(prompt_text: str) -> re.Match[str] | None:
    tool_turn = prompt_text.rfind("<|im_start|>tool")
    if tool_turn >= 0 and (last := _SAY.search(prompt_text, tool_turn)) is not None:
        return last
    return _SAY.search(prompt_text)


class FakeTokenizer:
    """One token per UTF-8 byte, plus ChatML specials. Decoding never fails (bad bytes -> U+FFFD)."""

    bos_token_id = None
    bos_token = None
    eos_token = "<|im_end|>"
    eos_token_ids: ClassVar[list[int]] = [EOS_ID]
    add_bos = False
    vocab_size = BYTE_OFFSET + 256
    all_special_ids = frozenset(range(BYTE_OFFSET))
    _special = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        for piece in self._special.split(text):
            if piece in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS.index(piece))
            else:
                ids.extend(b + BYTE_OFFSET for b in piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for i in ids:
            if i < BYTE_OFFSET:
                if not skip_special_tokens:
                    out += SPECIAL_TOKENS[i].encode()
            else:
                out.append(i - BYTE_OFFSET)
        return out.decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str:
        return SPECIAL_TOKENS[token_id] if token_id < BYTE_OFFSET else f"<0x{token_id - BYTE_OFFSET:02X}>"

    def token_bytes(self, token_id: int) -> bytes:
        """What the token spells (the grammar engine's view of the vocabulary)."""
        return (
            SPECIAL_TOKENS[token_id].encode() if token_id < BYTE_OFFSET else bytes([token_id - BYTE_OFFSET])
        )

    def token_to_id(self, token: str) -> int | None:
        return SPECIAL_TOKENS.index(token) if token in SPECIAL_TOKENS else None


def fake_model_bundle(name: str = "fake-model", max_model_len: int = 4096) -> ModelBundle:
    config = ModelConfig(
        model_type="fake",
        vocab_size=FakeTokenizer.vocab_size,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=max_model_len,
        eos_token_ids=[EOS_ID],
    )
    return ModelBundle(
        name=name,
        path=Path("fake"),
        format="none",
        config=config,
        iter_weights=lambda: iter(()),
        tokenizer=FakeTokenizer(),  # type: ignore[arg-type]  # duck-typed like weights.tokenizer.Tokenizer
        chat_template=CHATML_TEMPLATE,
    )


class FakeRunner:
    supports_speculation = False  # it answers one scripted token per request (engine/speculative.py)

    def __init__(
        self,
        tokenizer: FakeTokenizer | None = None,
        kv_bytes_per_token: int = 128,
        state_bytes: int = 0,
        speculate: bool = False,
    ) -> None:
        self.supports_speculation = self.hybrid_speculation = speculate
        # kv_bytes_per_token only shapes how many blocks a MiB budget buys (tests use it to force preemption).
        self.tokenizer = tokenizer or FakeTokenizer()
        self.kv_bytes_per_token = kv_bytes_per_token
        self.slots = np.zeros(0, dtype=np.int64)  # the "KV cache": the token id stored at each slot
        self.block_size = 0
        self.replies: dict[str, list[int]] = {}
        self.known: dict[str, list[int]] = {}  # prompt + outputs, as the runner was told / sampled
        self.delay_s: dict[str, float] = {}
        self.prompt_lens: dict[str, int] = {}
        self.steps = 0
        self.embedding_reqs: set[str] = set()
        self.record_masks = False  # tests: keep every bitmask row given, per request, in `masks`
        self.masks: dict[str, list[bytes]] = {}
        self.state_bytes = state_bytes
        self.states: list[tuple[int, ...]] = []  # per state slot: the tokens folded into it
        self.keep_rows_seen: set[int] = set()  # every row state_keep named (tests check the range)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(
            num_layers=1, num_kv_heads=1, head_dim=self.kv_bytes_per_token // 16, dtype_bytes=8
        )

    @property
    def state_cache_spec(self) -> StateCacheSpec:
        return StateCacheSpec(num_layers=1, bytes_per_slot=self.state_bytes)  # 0: not hybrid (engine.py)

    def initialize_state_cache(self, num_slots: int) -> None:
        self.states = [()] * num_slots

    @property
    def device_name(self) -> str:
        return "fake"

    def available_kv_memory(self) -> int | None:
        return None

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots = np.full(num_blocks * block_size, -1, dtype=np.int64)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        self.steps += 1
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            for table in (self.replies, self.known, self.delay_s, self.prompt_lens):
                table.pop(req_id, None)
            self.embedding_reqs.discard(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            prompt_text = self.tokenizer.decode(new.prompt_token_ids, skip_special_tokens=False)
            said = _script(prompt_text)
            reply = said.group(1).replace("\\n", "\n") if said else DEFAULT_REPLY
            self.replies[new.req_id] = self.tokenizer.encode(reply)
            self.known[new.req_id] = list(new.prompt_token_ids) + list(new.output_token_ids)
            self.prompt_lens[new.req_id] = len(new.prompt_token_ids)
            if new.sampling_params.embedding:
                self.embedding_reqs.add(new.req_id)
            slow = _SLOW.search(prompt_text)
            self.delay_s[new.req_id] = int(slow.group(1)) / 1000 if slow else 0.0
        if batch.kv_copies:  # partial prefix reuse: a cached block's first tokens, before the writes
            src, dst = batch.kv_copy_slots()
            self.slots[dst] = self.slots[src]
        self.slots[batch.slot_mapping] = batch.input_ids
        if self.state_bytes:
            self._advance_states(batch)
        time.sleep(max((self.delay_s.get(r, 0.0) for r in batch.req_ids), default=0.0))

        sampled: list[list[int]] = []
        logprobs: list[list[TokenLogprobs]] = []
        embeddings: dict[str, list[float]] = {}
        inputs = batch.sampling
        assert inputs is not None and inputs.num_rows == len(batch.sample_req_ids)
        for row, req_id in enumerate(batch.req_ids):
            if req_id not in batch.sample_req_ids:
                continue
            sample_row = batch.sample_req_ids.index(req_id)
            num_drafts = batch.sample_req_ids.count(req_id) - 1  # a verify row samples at every draft too
            self._check_context(req_id, batch, row, num_drafts)
            if req_id in self.embedding_reqs:
                embeddings[req_id] = fake_embedding(self.known[req_id])
                sampled.append([])
                logprobs.append([])
                continue
            # The reply position comes from the engine's sampling inputs, as a seeded draw's would.
            num_out = int(inputs.token_index[sample_row])
            assert num_out == len(self.known[req_id]) - self.prompt_lens[req_id], "token_index out of sync"
            reply = self.replies[req_id]
            end = int(batch.query_start_loc[row + 1])
            drafts = batch.input_ids[end - num_drafts : end].tolist()
            kept = True
            for j in range(num_drafts + 1):
                token = reply[num_out + j] if num_out + j < len(reply) else EOS_ID
                if inputs.token_bitmask is not None:
                    token = self._masked(req_id, inputs.token_bitmask[sample_row + j], token)
                if kept:  # the engine keeps drafts while they match (speculative.accept_drafts)
                    self.known[req_id].append(token)
                    kept = j < num_drafts and token == drafts[j]
                sampled.append([token])
                logprobs.append([TokenLogprobs(token, -0.5, [(token, -0.5), (EOS_ID, -1.5)])])
        return RunnerOutput(list(batch.sample_req_ids), sampled, logprobs, embeddings or None)

    def _masked(self, req_id: str, words: np.ndarray, token: int) -> int:
        if self.record_masks:
            self.masks.setdefault(req_id, []).append(words.tobytes())
        allowed = unpack_bitmask(words[None, :], self.tokenizer.vocab_size)[0]
        return token if allowed[token] else int(np.flatnonzero(allowed)[0])

    def _check_context(self, req_id: str, batch: BatchInputs, row: int, num_drafts: int = 0) -> None:
        seq_len = int(batch.seq_lens[row]) - num_drafts  # (drafts are guesses, not yet its tokens)
        positions = np.arange(seq_len)
        table = batch.block_tables[row]
        slots = (
            table[positions // self.block_size].astype(np.int64) * self.block_size
            + positions % self.block_size
        )
        context = self.slots[slots].tolist()
        expected = self.known[req_id][:seq_len]
        if context != expected:
            raise AssertionError(
                f"KV cache corrupted for {req_id}: read {context[-8:]}, expected {expected[-8:]}"
            )

    def _advance_states(self, batch: BatchInputs) -> None:
        for source, dest in batch.state_copies:  # in order, before the rows move on
            self.states[dest] = self.states[source]
        assert batch.state_slots is not None, "a hybrid model's batch names each row's state slot"
        qsl = batch.query_start_loc
        keep = batch.state_keep
        for row, req_id in enumerate(batch.req_ids):
            slot, start, end = int(batch.state_slots[row]), int(qsl[row]), int(qsl[row + 1])
            first = int(batch.positions[start])
            state = () if first == 0 else self.states[slot]
            if state != tuple(self.known[req_id][:first]):
                raise AssertionError(f"state of {req_id} (slot {slot}) is not its first {first} tokens")
            fed = tuple(int(t) for t in batch.input_ids[start:end])
            self.states[slot] = state + fed
            for t in range(start, end) if keep is not None else ():
                assert keep is not None
                if keep[t] >= 0:  # a verify row's state after this position (engine/hybrid_spec.py)
                    assert keep[t] != slot, "a verify row's state kept in its own slot"
                    self.keep_rows_seen.add(int(keep[t]))
                    self.states[int(keep[t])] = state + fed[: t - start + 1]

    def shutdown(self) -> None:
        self.replies.clear()


def fake_embedding(token_ids: list[int], dim: int = 8) -> list[float]:
    """Mean of per-token vectors (token t: sin/cos features of t), L2-normalised: the real pooling's shape."""
    ids = np.asarray(token_ids, dtype=np.float64)[:, None]
    vectors = np.concatenate(
        [np.sin(ids * np.arange(1, dim // 2 + 1)), np.cos(ids * np.arange(1, dim // 2 + 1))], 1
    )
    mean = vectors.mean(axis=0)
    return (mean / np.linalg.norm(mean)).tolist()


def create_runner(model: ModelBundle, options: object) -> FakeRunner:
    return FakeRunner(model.tokenizer if isinstance(model.tokenizer, FakeTokenizer) else None)
