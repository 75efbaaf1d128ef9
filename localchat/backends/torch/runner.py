"""The PyTorch `ModelRunner`: weights, paged KV cache, forward pass and sampling on one device.

KV cache: one tensor per layer, `[2 (K, V), num_kv_heads, num_blocks * block_size, head_dim]` in the
compute dtype, bf16, or int8 codes plus float32 scales (`--kv-cache-dtype`, kv_cache.py; layout:
attention.py), zero-filled (unwritten slots are masked out, and zeros keep
`0 * value` finite; on CPU the zero pages are committed lazily, as blocks are first written). Slot
`s = block_id * block_size + offset` is column `s`; block 0 is the engine's null block.

Device `auto`: cuda > mps > cpu. Dtype `auto`:

| device | dtype | why |
|---|---|---|
| cuda | bfloat16 if supported, else float16 | tensor cores; bf16 needs no loss scaling |
| mps  | float16 | fastest type Metal runs everywhere |
| cpu with native bf16 (AVX512-BF16 / AMX) | bfloat16 | half the bytes of fp32 and decode is memory-bound |
| other cpu | float32 | bf16 matmuls are emulated there |

Why bf16 on such CPUs, measured on the 2-core Zen 5 dev box (SmolLM2-135M, one thread, same load):
fp32 prefill 294 / decode 16.0 / 16-stream 113 tok/s; bf16 592 / 38.6 / 221 tok/s. Decode reads every
weight once per token and is bandwidth-bound. bf16's greedy choice matched fp32's on 383 of 392
teacher-forced tokens (the 8 benchmark chat prompts).
For one-row matmuls, torch's own bf16 GEMV streams weights at ~28 GB/s where oneDNN gets ~12; it is
only reachable with oneDNN off, and oneDNN wins from two rows up, so single-row matmuls switch oneDNN
off (`_matmul_backend`). With bf16 on CPU, GGUF Q4_0/Q4_1 linears and a Q8_0 LM head stay 4-bit for
decode-sized steps (quant.py, `LOCALCHAT_TORCH_QUANT`); float32 keeps every weight dense and exact.
CPU threads: all cores or all but one, picked per kind of step by measuring (threads.py), unless the
user sets a count.
torch.compile is not used: compiling the 30-layer decode graph took minutes
on this box and a per-layer compile gave no measurable gain over this eager path.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from localchat.arch.moe import ffn_width
from localchat.backend_settings import resolve_backend_variables, settings_in_effect
from localchat.backends import RunnerOptions
from localchat.backends.pooling import Pooler
from localchat.backends.torch.attention import AttentionMetadata
from localchat.backends.torch.cpu.one_row import OneRowStep
from localchat.backends.torch.cpu.onednn_caches import bound_matmul_caches
from localchat.backends.torch.cpu.threads import ThreadGovernor
from localchat.backends.torch.cuda.cuda_graphs import DecodeGraphs
from localchat.backends.torch.cuda.gpu_attention_meta import TritonAttentionMetadata
from localchat.backends.torch.device import adaptive_thread_choices, cpu_threads, pick_device, pick_dtype
from localchat.backends.torch.eagle3_attach import attach_eagle3
from localchat.backends.torch.kernel_choice import attention_kernel, graph_mode, one_step_choice
from localchat.backends.torch.kv_cache import Int8KVCache, KVCache, copy_slots, kv_element_dtype
from localchat.backends.torch.layers import rms_norm
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.mtp_proposer import attach_mtp
from localchat.backends.torch.picture_attention import add_picture_masks
from localchat.backends.torch.quant import pick_policy
from localchat.backends.torch.sampler import SampleResult, new_generator, sample
from localchat.backends.torch.vision.images import ImageEmbedder, load_image_embedder
from localchat.backends.torch.weights import load_decoder
from localchat.engine.interface import (
    BatchInputs,
    KVCacheSpec,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
)
from localchat.errors import ModelLoadError
from localchat.host_memory import mem_available
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig

if TYPE_CHECKING:
    from collections.abc import Iterable

    from localchat.backends.torch.eagle3_proposer import Eagle3Proposer, HiddenTaps
    from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)
bound_matmul_caches()  # before any matmul runs: oneDNN reads its cache sizes once

CPU_KV_FRACTION = 0.25  # of MemAvailable; pages become resident only as the pool fills
GPU_KV_FRACTION = 0.90  # of free device memory after the warm-up forward


@dataclass(slots=True)
class _Step:
    """One step's inputs as device tensors."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata | TritonAttentionMetadata
    logits_indices: torch.Tensor | None  # None: every token is sampled, in order


class TorchRunner:
    # Hybrid models' verify rows write each position's state into spec rows (state_cache.StepRows.verify,
    # engine/hybrid_spec.py), so speculation works for them too.
    hybrid_speculation = True

    def __init__(self, model: ModelBundle, options: RunnerOptions) -> None:
        self.device = pick_device(options.device)
        if self.device.type == "cpu" or options.num_threads:
            torch.set_num_threads(cpu_threads(options.num_threads))
        choices = adaptive_thread_choices(options.num_threads) if self.device.type == "cpu" else None
        self.threads = ThreadGovernor(choices) if choices else None
        self.dtype = pick_dtype(options.dtype, self.device)
        self.kv_dtype = kv_element_dtype(options.kv_cache_dtype, self.dtype)
        self.config = model.config
        # The tuning variables, resolved once: what loading and every step read (backend_settings.py)
        self.backend_settings = dict(
            resolve_backend_variables() if options.backend_settings is None else options.backend_settings
        )
        with self.settings():
            self.quant = pick_policy(
                self.device, self.dtype, _linear_bytes(model.config, self.dtype), mem_available(), options.isq
            )
            with torch.inference_mode(), _device_memory_errors(self.device, model.name):
                self.model = self._load_decoder(model)
                # The vision tower of a multimodal checkpoint (Gemma 3): images reach the model through it.
                self.images = self._load_images(model)
            # "triton" on CUDA (see kernel_choice.py), else "torch"; both take every layer's AttentionOptions.
            self.attention = attention_kernel(self.device)
        if self.attention == "triton" and self.kv_dtype != self.dtype:
            # Triton's kernels (triton_attention.py) read a cache in the compute dtype only.
            log.info(
                "--kv-cache-dtype %s: the Triton attention kernels need the compute dtype; "
                "using the PyTorch attention path",
                options.kv_cache_dtype,
            )
            self.attention = "torch"
        self.graph_mode = graph_mode(
            self.device, self.attention, options.cuda_graphs and self.model.capturable
        )
        self.graphs: DecodeGraphs | None = None
        self.generator = new_generator(self.device, options.seed)  # unseeded rows' draws
        self.pooler = Pooler(
            lambda h: rms_norm(h, self.model.norm, self.config.rms_norm_eps).float().sum(dim=0).cpu().numpy()
        )
        self.kv_caches: list[KVCache] = []
        self.block_size = 0
        # See the module docstring: torch's bf16 GEMV beats oneDNN for one-row matmuls on CPU.
        self._native_gemv = self.device.type == "cpu" and self.dtype == torch.bfloat16
        self.hidden_taps: HiddenTaps | None = None  # set by eagle3_proposer: layer inputs for the head
        self._one_row: OneRowStep | Literal[False] | None = False  # False: not planned yet (first step)

    def settings(self) -> contextlib.AbstractContextManager[None]:
        """This runner's backend settings in effect for what runs inside (load, steps, graph capture)."""
        return settings_in_effect(self.backend_settings)

    def _load_decoder(self, model: ModelBundle) -> DecoderLM:
        """The bundle's decoder on this runner's device (a pipeline stage loads only its layers)."""
        return load_decoder(model.config, model.iter_weights(), self.device, self.dtype, self.quant)

    def _load_images(self, model: ModelBundle) -> ImageEmbedder | None:
        """The checkpoint's vision tower, if any (a later pipeline stage loads none)."""
        return load_image_embedder(model.path, self.device, self.dtype)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        c = self.config
        scale_bytes = 4 if self.kv_dtype == torch.int8 else 0  # one float32 scale per token, head, K/V
        return KVCacheSpec(
            self._num_kv_layers, c.num_key_value_heads, c.head_dim, self.kv_dtype.itemsize, scale_bytes,
            str(self.kv_dtype).removeprefix("torch."),
        )  # fmt: skip

    @property
    def _num_kv_layers(self) -> int:
        # Hybrid models (models/qwen3_next.py) keep K/V only for their full-attention layers.
        return int(getattr(self.model, "num_kv_layers", self.config.num_hidden_layers))

    @property
    def state_cache_spec(self) -> StateCacheSpec | None:
        """Hybrid models' per-sequence state (engine/state_slots.py); None for plain transformers."""
        spec = getattr(self.model, "state_cache_spec", None)
        return spec(self.dtype) if spec is not None else None

    def initialize_state_cache(self, num_slots: int) -> None:
        self.model.initialize_state_cache(num_slots, self.dtype, self._zeros)  # type: ignore[operator]

    @property
    def device_name(self) -> str:
        name = str(self.device)
        if self.device.type == "cuda":
            name += f" {torch.cuda.get_device_name(self.device)}"
        details = str(self.dtype).removeprefix("torch.")
        if self.kv_dtype != self.dtype:
            details += f", KV cache {str(self.kv_dtype).removeprefix('torch.')}"
        if self.quant.kernels is not None:
            details += f", GGUF blocks on localchat's {self.quant.kernels.name} kernels"
            details += " + dense copies" if self.quant.block_copies else ""
            details += " (precise activations)" if self.quant.precise else ""
        if self.quant.isq_blocks:
            details += f", dense weights quantized to {self.quant.isq_blocks} at load"
        if self.quant.int4:
            details += ", int4 linears" + (" + dense copies" if self.quant.dense_copy else "")
            if self.quant.cuda:
                kernels = {"both": "tinygemm for decode, Triton for 32+ rows"}
                details += f" ({kernels.get(self.quant.cuda_kernel, self.quant.cuda_kernel)})"
        return f"{name} ({details})"

    def available_kv_memory(self) -> int | None:
        if self.device.type == "cuda":
            return self._cuda_free_after_warmup()
        if self.device.type == "mps":
            free = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
            return max(0, int(free * 0.5))
        available = mem_available()
        return None if available is None else int(available * CPU_KV_FRACTION)

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        c = self.config
        shape = (2, c.num_key_value_heads, num_blocks * block_size, c.head_dim)
        if self.kv_dtype == torch.int8:
            self.kv_caches = [
                Int8KVCache(self._zeros(shape, torch.int8), self._zeros(shape[:-1], torch.float32))
                for _ in range(self._num_kv_layers)
            ]
        else:
            self.kv_caches = [self._zeros(shape, self.kv_dtype) for _ in range(self._num_kv_layers)]
        self.block_size = block_size

    def prepare_decode_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Engine hook, after the KV cache exists: fix the RoPE table for the served context (longrope),
        then capture decode graphs per batch-size bucket."""
        self.model.rotary.serve_context(max_model_len)
        if self.graph_mode is None:
            return
        with torch.inference_mode(), self.settings():
            self.graphs = DecodeGraphs(
                self._decode_logits,
                max_num_seqs=max_num_seqs,
                max_seq_len=max_model_len,
                block_size=self.block_size,
                kv_heads=self.config.num_key_value_heads,
                device=self.device,
                capture=self.graph_mode == "capture",
            )

    def _decode_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        hidden = self.model.hidden_states(input_ids, positions, meta, self.kv_caches)  # type: ignore[arg-type]
        return self.model.logits(hidden)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        # An anonymous mapping is zero pages that become resident only when written, so a large pool
        # costs RAM as it fills; torch.zeros would commit all of it up front. (Not numpy: it asks for
        # huge pages, and each block touched then commits 2 MiB.)
        buffer = mmap.mmap(-1, math.prod(shape) * dtype.itemsize)
        return torch.frombuffer(buffer, dtype=dtype).view(shape)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        self._update_states(scheduler_output)
        if scheduler_output.is_empty or batch.num_tokens == 0:
            return RunnerOutput(req_ids=[], sampled_token_ids=[])
        threads = self.threads.threads_for(batch.num_tokens) if self.threads else 0
        if threads and threads != torch.get_num_threads():  # setting it costs even when unchanged
            torch.set_num_threads(threads)
        start = time.perf_counter()
        if (lean := self._one_row_step(batch)) is not None and lean.head is not None:
            # One decode token of one stream: reads no setting, keeps no autograd state: no contexts (one_row.py)
            assert batch.sampling is not None, "the engine builds sampling inputs for every sampled row"
            result = sample(lean.logits(batch), batch.sampling, self.generator)
            if self.threads:
                self.threads.record(1, threads, time.perf_counter() - start)
            return RunnerOutput.one_token_each(batch.sample_req_ids, result.token_ids, result.logprobs)
        with torch.inference_mode(), self.settings(), one_step_choice(self.device):
            logits = self._logits(batch)
            embeddings = self.pooler.finish(batch.sample_req_ids)
            # Embedding rows got logits too (one LM-head row each) but do not sample.
            rows = [i for i, r in enumerate(batch.sample_req_ids) if r not in embeddings]
            sample_ids = [batch.sample_req_ids[i] for i in rows]
            assert batch.sampling is not None, "the engine builds sampling inputs for every sampled row"
            inputs = batch.sampling
            if embeddings:
                logits, inputs = logits[rows], inputs.take(rows)
            result = sample(logits, inputs, self.generator) if sample_ids else SampleResult([])
        if self.threads:
            self.threads.record(batch.num_tokens, threads, time.perf_counter() - start)
        output = RunnerOutput.one_token_each(sample_ids, result.token_ids, result.logprobs)
        return output.with_embeddings(batch.sample_req_ids, embeddings)

    def eagle3_proposer(self, head_path: str, target_name: str, token_limit: int) -> Eagle3Proposer:
        """`--speculative eagle`: load the EAGLE-3 head at `head_path`, check it against this model, and
        start keeping the hidden states it reads."""
        return attach_eagle3(self, head_path, target_name, token_limit)

    def mtp_proposer(
        self, weights: Iterable[WeightTensor], target_name: str, token_limit: int
    ) -> Eagle3Proposer:
        """`--speculative mtp`: the checkpoint's own multi-token-prediction head (its `mtp.*` tensors
        among `weights`), attached the same way (mtp_proposer.py)."""
        return attach_mtp(self, weights, target_name, token_limit)

    def compute_logits(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> torch.Tensor:
        """Like `execute_model` but returns the float32 logits [num_sampled, vocab] (tests, debugging)."""
        self._update_states(scheduler_output)
        with torch.inference_mode(), self.settings(), one_step_choice(self.device):
            return self._logits(batch).float()

    def shutdown(self) -> None:
        self.kv_caches = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _update_states(self, out: SchedulerOutput) -> None:
        # Only pooling keeps per-request state; sampling gets everything from BatchInputs.sampling.
        # Forget first: a preempted request comes back in the same step as a new one.
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.pooler.forget(req_id)
        for new in out.scheduled_new_reqs:
            if new.sampling_params.embedding:
                self.pooler.start(new.req_id)

    def _logits(self, batch: BatchInputs) -> torch.Tensor:
        # block_size, not kv_caches: a pipeline stage of state-slot layers only has no K/V layer
        assert self.block_size and batch.block_size == self.block_size, "initialize_kv_cache first"
        if (lean := self._one_row_step(batch)) is not None:  # one decode token of one stream
            with self._matmul_backend(1):
                return self.model.logits(lean.hidden(batch))
        if batch.kv_copies:  # partial prefix reuse: before anything of this step writes the cache
            src, dst = (torch.from_numpy(a).to(self.device) for a in batch.kv_copy_slots())
            copy_slots(self.kv_caches, src, dst)
        if batch.state_copies and (states := getattr(self.model, "states", None)) is not None:
            states.copy_slots(batch.state_copies)  # hybrid prefix checkpoints, before begin_step's zeroing
        pooled = self.pooler.rows(batch)  # embedding rows need the hidden states: never a graph then
        # A step carrying image rows never replays a graph: the graph would skip the scatter.
        plain = not batch.image_slices and batch.rope_positions is None  # M-RoPE rows: no graph either
        # EAGLE-3 (HiddenTaps): no graph; decode-only steps stay fused and copy out the head's inputs.
        taps = self.hidden_taps if plain else None
        if self.graphs is not None and taps is None and not pooled and plain and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        step = self._prepare(batch)
        if (begin_step := getattr(self.model, "begin_step", None)) is not None:  # hybrid: bind state slots
            begin_step(
                batch.state_slots, batch.query_start_loc, batch.positions, self.device, batch.state_keep
            )
        hooked: Any = self.model  # only models with the image hook (models/gemma.py) get a tower
        if batch.image_slices:
            assert self.images is not None, "image input reached a model without a vision tower"
            hooked.image_embeds = self.images.step_embeds(batch.image_slices)
        try:
            with self._matmul_backend(batch.num_tokens):
                if taps is not None:
                    hidden = taps.hidden_states(
                        self.model, batch, step.input_ids, step.positions, step.meta, self.kv_caches
                    )
                else:
                    hidden = self.model.hidden_states(
                        step.input_ids, step.positions, step.meta, self.kv_caches
                    )
        finally:
            if batch.image_slices:
                hooked.image_embeds = None
        if pooled:
            self.pooler.add(batch, hidden, pooled)
        if step.logits_indices is not None:
            hidden = hidden[step.logits_indices]
        with self._matmul_backend(hidden.shape[0]):
            return self.model.logits(hidden)

    def _one_row_step(self, batch: BatchInputs) -> OneRowStep | None:
        """cpu/one_row.py's step where it runs `batch` (planned at the first step: the weights are in place)."""
        if self._one_row is False:
            self._one_row = OneRowStep.plan(self) if type(self) is TorchRunner else None  # not a stage
        if (lean := self._one_row) and not self.pooler.counts and self.hidden_taps is None:  # EAGLE-3, MTP
            return lean if lean.takes(batch, self.kv_caches, self.backend_settings) else None
        return None

    def _prepare(self, batch: BatchInputs) -> _Step:
        cpu = self.device.type == "cpu"  # (.to(cpu) returns the same tensor, at a dispatch's cost)

        def to_device(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
            return tensor if cpu else tensor.to(self.device)

        indices = batch.logits_indices
        rows = len(indices)
        if rows == 1 == batch.num_tokens:  # one decode token (the common step): no arange to compare
            all_tokens = bool(indices[0] == 0)
        else:
            all_tokens = rows == batch.num_tokens and bool((indices == np.arange(rows)).all())
        return _Step(
            input_ids=to_device(batch.input_ids),
            # M-RoPE (vision/mrope.py): [3, T] rotary positions; the KV slots still follow `positions`.
            positions=to_device(batch.positions if batch.rope_positions is None else batch.rope_positions),
            meta=self._metadata(batch),
            logits_indices=None if all_tokens else to_device(indices),
        )

    @property
    def pictures_both_ways(self) -> bool:
        """Whether the model attends over each picture's tokens both ways (Gemma 3; Gemma 4 "vision"): the
        engine then never cuts a picture across prefill chunks."""
        return self.images is not None and bool(getattr(self.model, "pictures_both_ways", False))

    def _metadata(self, batch: BatchInputs) -> AttentionMetadata | TritonAttentionMetadata:
        kv_heads = self.config.num_key_value_heads
        if batch.image_slices and self.pictures_both_ways:  # the torch path's masked SDPA, on CUDA too
            meta = AttentionMetadata.from_batch(batch, self.device, kv_heads)
            add_picture_masks(meta, batch)
            return meta
        if self.attention == "triton":
            return TritonAttentionMetadata.from_batch(batch, self.device, kv_heads, self._num_sms)
        return AttentionMetadata.from_batch(batch, self.device, kv_heads)

    @property
    def _num_sms(self) -> int:
        if self.device.type != "cuda":
            return 132  # the interpreter twin: any count works
        return torch.cuda.get_device_properties(self.device).multi_processor_count

    @contextlib.contextmanager
    def _matmul_backend(self, rows: int) -> Iterator[None]:
        if not (self._native_gemv and rows == 1):
            yield
            return
        previous = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
        try:
            yield
        finally:
            torch.backends.mkldnn.enabled = previous

    def _cuda_free_after_warmup(self) -> int:
        # A prefill-sized forward allocates the activations a real step will need before we measure.
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._warmup(num_tokens=512)
        torch.cuda.synchronize(self.device)
        activations = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()  # cached blocks would otherwise count as used
        free, _ = torch.cuda.mem_get_info(self.device)
        budget = int(free * GPU_KV_FRACTION) - activations
        if budget <= 0:
            raise ModelLoadError(
                f"The model fits on {self.device} but leaves no memory for the KV cache "
                f"({free / 2**30:.1f} GiB free after loading). Use a smaller or 4-bit model (--isq q4), "
                "or set --mem to a small KV cache size in MiB."
            )
        return budget

    def _warmup(self, num_tokens: int) -> None:
        block_size = 16
        blocks = -(-num_tokens // block_size)
        saved = self.kv_caches, self.block_size
        self.initialize_kv_cache(blocks + 1, block_size)
        try:
            positions = np.arange(num_tokens, dtype=np.int64)
            batch = BatchInputs(
                req_ids=["warmup"],
                input_ids=np.zeros(num_tokens, dtype=np.int64),
                positions=positions,
                slot_mapping=positions + block_size,
                query_start_loc=np.array([0, num_tokens], dtype=np.int32),
                seq_lens=np.array([num_tokens], dtype=np.int32),
                block_tables=np.arange(1, blocks + 1, dtype=np.int32)[None, :],
                logits_indices=np.array([num_tokens - 1], dtype=np.int64),
                sample_req_ids=["warmup"],
                max_query_len=num_tokens,
                max_seq_len=num_tokens,
                block_size=block_size,
            )
            with torch.inference_mode():
                self._logits(batch)
        finally:
            self.kv_caches, self.block_size = saved


@contextlib.contextmanager
def _device_memory_errors(device: torch.device, name: str) -> Iterator[None]:
    """A model too large for the GPU is a message, not a CUDA traceback."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        _, total = torch.cuda.mem_get_info(device)
        raise ModelLoadError(
            f"{name} does not fit in {device}'s {total / 2**30:.1f} GiB of memory. Use a smaller or 4-bit "
            "model (a Q4 GGUF file, or --isq q4 for safetensors), or --device cpu."
        ) from exc


def _linear_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """The decoder layers' matrices in `dtype`: what dense copies of int4 weights would cost."""
    c = config
    attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_layer = attention + 3 * c.hidden_size * ffn_width(c)
    return c.num_hidden_layers * per_layer * dtype.itemsize
