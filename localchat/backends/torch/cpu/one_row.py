"""The commonest CPU step, one decode token of one sequence, from the batch's arrays straight to the fused
layers' C call (decode_step.py) and the LM head, with none of the general path's per-step tensors.

The general path builds, every token, the token and position tensors, the attention metadata (block
table, slot, lengths), an embedding row through the block table's general gather, two RoPE row slices,
and checks the plan's conditions again: ~200 µs of the engine thread's CPU a token on real
Qwen2.5-Coder-1.5B (#34), most of it the first touch of code and objects that the ~1 GB of weights
streamed since the last token evicted. Here the embedding row, the token id, slot, context length and
block table live in buffers allocated once; the embedding is dequantized into the row the C layers then
update in place; the RoPE rows are read in place from Rotary's cached tables; the C call gets its own
argument struct with the step-invariant fields set once. Same kernels, same inputs, same bits
(tests/backends/test_one_row_step.py checks logits and tokens against the general path).

Taken only where the general path would run the same fused call: a plain `DecoderLM` whose layers have a
fused plan, full rotary of the base `Rotary`, a plain TorchRunner (no pipeline stage), bfloat16/float32
caches, the compiled kernels the plan was built for, and a step with nothing else in it (no prefix-copy,
state, picture, M-RoPE, pooled or EAGLE-3 rows).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from localchat.backend_settings import settings_in_effect
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.decode_step import FusedDecode, step_mode
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.kernel_choice import cpu_decode_kernels
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import Rotary
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.qwen_vl import VisionLanguage
from localchat.backends.torch.quant import linear
from localchat.engine.interface import BatchInputs
from localchat.kernels import library as c_library
from localchat.kernels import step as c_step

if TYPE_CHECKING:
    from localchat.backends.torch.runner import TorchRunner

BLOCKS_AT_FIRST = 256  # block-table entries the buffer starts with (grows by doubling)


class OneRowStep:
    """One model's lean one-token step: buffers and a C argument struct kept between steps."""

    def __init__(self, model: DecoderLM, fused: FusedDecode, embed: Callable[[int], None], x: torch.Tensor):
        self.model = model
        self.fused = fused
        self.rotary = model.rotary
        self.embed = embed  # writes token `id`'s embedding row into `x`
        self.x = x  # [1, hidden]: the embedding, then (in place) the last layer's output
        self.dtype = x.dtype
        self.vocab = model.embed.shape[0]
        self.ids = np.zeros(1, dtype=np.int64)  # the token, where the dense embedding's gather reads it
        self.slot = np.zeros(1, dtype=np.int64)
        self.lens = np.zeros(1, dtype=np.int64)
        self.tables = np.zeros(BLOCKS_AT_FIRST, dtype=np.int64)
        self.args = c_step.StepArgs.from_buffer_copy(fused.args)  # the model's shape, set at plan time
        args = self.args
        args.x, args.rows, args.bf16 = x.data_ptr(), 1, int(x.dtype == torch.bfloat16)
        args.slots, args.seq_lens, args.tables = (
            self.slot.ctypes.data,
            self.lens.ctypes.data,
            self.tables.ctypes.data,
        )
        args.precise, args.aux, args.naux = int(fused.ops.precise), 0, 0
        self.address = c_step.address(args)
        self.call = fused.ops.lib.lc_decode_layers
        self.caches: list[KVCache] | None = None  # the cache list `args` holds the addresses of
        # DecoderLM.logits' weights where its kernels need no step context: a block-matrix head (a dense
        # one runs F.linear under the runner's matmul backend choice) and a norm the RMSNorm kernel takes.
        head = model.embed if model.lm_head is None else model.lm_head
        norm = model.norm
        plain_norm = norm.dtype == x.dtype and norm.is_contiguous()
        self.head = head if isinstance(head, BlockMatrix) and plain_norm else None
        self.norm, self.eps = norm, model.config.rms_norm_eps
        self.settings: dict[str, str] | None = None  # the backend settings `kernels` was worked out for
        self.kernels: cpu_kernels.Kernels | None = None  # the step's kernels, None: the general path

    @classmethod
    def plan(cls, runner: TorchRunner) -> OneRowStep | None:
        """The lean step for `runner`'s model, or None where the general path must run every step."""
        model = runner.model  # the runner asks only as a plain TorchRunner (no pipeline stage)
        if runner.device.type != "cpu" or not isinstance(model, DecoderLM):
            return None
        kind = type(model)
        # VisionLanguage (the Llama / Qwen2 classes) runs DecoderLM's forward on steps without image rows.
        plain = kind.hidden_states in (DecoderLM.hidden_states, VisionLanguage.hidden_states) and all(
            getattr(kind, name) is getattr(DecoderLM, name) for name in ("embed_tokens", "logits")
        )
        if not plain or type(model.rotary) is not Rotary or getattr(model, "begin_step", None) is not None:
            return None
        fused = model.decode_plan()
        if fused is None or 2 * model.rotary.inv_freq.shape[0] != fused.head_dim:
            return None
        with torch.inference_mode(False):  # a plain tensor: steps may run outside inference mode
            x = torch.empty((1, fused.hidden), dtype=fused.dtype)
        embed = _embedder(model.embed, x)
        return None if embed is None else cls(model, fused, embed, x)

    def takes(self, batch: BatchInputs, kv_caches: list[KVCache], settings: Mapping[str, str]) -> bool:
        """Whether `batch` is one plain decode token that the general path would run on this fused plan
        under the runner's backend `settings` (the runner checks its own conditions: pooling, EAGLE-3)."""
        if kv_caches is not self.caches and not self._bind(kv_caches, batch.block_size):
            return False
        if settings != self.settings:
            self._choose(settings)
        return (
            self.kernels is not None
            and batch.num_tokens == 1
            and len(batch.req_ids) == 1
            and batch.block_size == self.args.block_size
            and not batch.kv_copies
            and not batch.state_copies
            and not batch.image_slices
            and batch.rope_positions is None
            and 0 <= batch.input_ids[0] < self.vocab  # the general gather's bounds check (dense tables)
        )

    def _choose(self, settings: Mapping[str, str]) -> None:
        """The kernels a step runs on under `settings`, where they are this plan's and the fused step is
        on (as FusedDecode.takes decides); worked out again only when the settings change (a test may
        edit a runner's copy): each step's reads of them cost ~20 µs on cold caches (#34)."""
        with settings_in_effect(settings):
            kernels = cpu_decode_kernels(self.x.device)
            fused = step_mode() == "fused"
        self.kernels = (
            kernels if fused and kernels is not None and kernels.isa == self.fused.ops.isa else None
        )
        self.settings = dict(settings)

    def logits(self, batch: BatchInputs) -> torch.Tensor:
        """The step's logits [1, vocab], DecoderLM.logits of `hidden` by the same kernels, with no backend
        setting read and no autograd state to keep: the runner calls it outside its step contexts (the
        three cost ~60 µs on cold caches). Only where `head` is set."""
        return self.head_logits(self.hidden(batch))

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """DecoderLM.logits(hidden) on the step's kernels (layers.rms_norm's kernel path, quant.linear)."""
        assert self.head is not None and self.kernels is not None
        return linear(self.kernels.rms_norm(hidden, self.norm, self.eps), self.head)

    def hidden(self, batch: BatchInputs) -> torch.Tensor:
        """The step's token through the fused layers -> its last hidden state [1, hidden] (pre-norm; the
        buffer the next step overwrites)."""
        self.embed(int(batch.input_ids[0]))
        seq_len = int(batch.seq_lens[0])
        blocks = -(-seq_len // self.args.block_size)
        if blocks > self.tables.shape[0]:
            self._grow(blocks)
        self.tables[:blocks] = batch.block_tables[0, :blocks]
        self.slot[0] = batch.slot_mapping[0]
        self.lens[0] = seq_len
        args = self.args
        args.cos, args.sin = self.rotary.row_addresses(int(batch.positions[0]), self.dtype)
        args.max_blocks = blocks
        args.nth = torch.get_num_threads()
        rc = self.call(self.address)
        if rc:
            c_library.check(
                rc, f"The CPU kernels rejected a one-row decode step at {seq_len} (internal error)."
            )
        return self.x

    def _bind(self, kv_caches: list[KVCache], block_size: int) -> bool:
        """Take a new cache list (the runner replaces it, never edits it, with its block size): its
        addresses and shape."""
        first = kv_caches[0] if kv_caches else None
        if not isinstance(first, torch.Tensor) or first.dtype not in (torch.float32, torch.bfloat16):
            return False
        if not all(isinstance(c, torch.Tensor) and c.is_contiguous() for c in kv_caches):
            return False
        args = self.args
        args.caches = self.fused._cache_args(kv_caches)
        self._table = self.fused.caches  # keeps the address array alive beside `args`
        args.cache_type = cpu_kernels.KV_BF16 if first.dtype == torch.bfloat16 else cpu_kernels.KV_F32
        args.num_slots = first.shape[2]
        args.block_size = block_size
        self.caches = kv_caches
        return True

    def _grow(self, blocks: int) -> None:
        size = self.tables.shape[0]
        while size < blocks:
            size *= 2
        self.tables = np.zeros(size, dtype=np.int64)
        self.args.tables = self.tables.ctypes.data


def _embedder(table: torch.Tensor | BlockMatrix, x: torch.Tensor) -> Callable[[int], None] | None:
    """A function writing a token's embedding row into x [1, hidden], the values `quant.embed_rows`
    gives in x's dtype; None for tables it does not take (several segments, another dtype)."""
    if isinstance(table, BlockMatrix):
        return _QuantizedRow(table, x) if len(table.segments) == 1 else None
    if table.dtype != x.dtype or not table.is_contiguous() or table.shape[1] != x.shape[1]:
        return None
    return _DenseRow(table, x)


class _QuantizedRow:
    """lc_dequant_rows of one id, as Kernels.dequantize_rows calls it, into x."""

    def __init__(self, table: BlockMatrix, x: torch.Tensor) -> None:
        seg = self.segment = table.segments[0]  # holds the rows' memory
        self.ids = np.zeros(1, dtype=np.int64)
        self.call = table.ops.lib.lc_dequant_rows
        flag = int(x.dtype == torch.bfloat16)
        self.args = (seg.type_id, seg.data.data_ptr(), table.cols, seg.row_bytes, self.ids.ctypes.data, 1)
        self.out = (x.data_ptr(), flag)
        self.what = f"{seg.qtype} rows of {table.cols} values"

    def __call__(self, token: int) -> None:
        self.ids[0] = token
        rc = self.call(*self.args, *self.out)
        if rc:
            c_library.check(rc, f"The CPU kernels cannot read {self.what}.")


class _DenseRow:
    """The row copied as F.embedding gathers it (same dtype: a byte copy)."""

    def __init__(self, table: torch.Tensor, x: torch.Tensor) -> None:
        self.table = table  # keeps the rows alive
        self.row_bytes = table.shape[1] * table.element_size()
        self.base, self.out = table.data_ptr(), x.data_ptr()

    def __call__(self, token: int) -> None:
        ctypes.memmove(self.out, self.base + token * self.row_bytes, self.row_bytes)
