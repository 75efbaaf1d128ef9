"""The MLX `ModelRunner`: weights, paged KV cache, forward pass and sampling with MLX arrays.

The same contract and structure as localchat/backends/torch/runner.py; only the array library differs.

KV cache: one K and one V array per layer, flat `[num_blocks * block_size, num_kv_heads, head_dim]`
(the contract's `[num_blocks, block_size, ...]` with two dims merged), zero-filled, in the compute
dtype. Writes go through `cache[slot_mapping] = k`, which MLX turns into an in-place scatter (see
localchat/backends/mlx/attention.py). Block 0 is the engine's null block.

Device `auto`: Metal (`gpu`) when MLX sees one, else `cpu`. `--device cpu|gpu` forces one. Dtype
`auto`, for activations, dense weights, KV cache and the scales/biases of quantized weights alike:

| device | dtype | why |
|---|---|---|
| cpu | float32 | MLX's CPU quantized matmul is only fast in float32: one token through a 1536x576 4-bit matrix took 0.85 ms in float32, 6.5 ms in bfloat16, 30 ms in float16 (2-core dev box) |
| gpu (Metal), checkpoint in bfloat16 | bfloat16 | the checkpoint's own precision |
| gpu (Metal), anything else (GGUF, fp16, fp32) | float16 | Metal's fast type; GGUF scales are float16, so Q4_0/Q4_1/Q8_0 stay exact |

GGUF Q4_0/Q4_1/Q8_0 weights stay quantized in memory (`mx.quantized_matmul`, group 32); other GGUF
types are dequantized to the compute dtype at load (localchat/backends/mlx/quant.py). On CPU, MLX's quantized
matmul costs the same per row whatever the batch, so steps of `CPU_DENSE_FROM_ROWS` rows or more
(prefill, wide decode batches) dequantize each matrix on the fly into a transient dense copy and run a
GEMM instead. Measured on the quiet dev box, float32, one 1536x576 Q4 matrix:

| rows | quantized matmul | dequantize + dense GEMM |
|---|---|---|
| 1 | 0.9 ms | 2.4 ms |
| 4 | 4.0 ms | 3.5 ms |
| 16 | 12.9 ms | 8.0 ms |
| 480 | 394 ms | 145 ms |

`--threads` has no MLX equivalent and is ignored.

Threads: the runner is built on the main thread but stepped on the engine thread. Since mlx 0.31.2
streams are thread-local (a Metal stream made on one thread fails on another: "There is no
Stream(gpu, 0) in current thread"), so every step runs under a stream of the calling thread, and
everything built at load time is evaluated there, leaving no pending work bound to the main thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from localchat.backends import RunnerOptions
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.mtp_proposer import MtpProposer, attach_mtp
from localchat.backends.mlx.sampler import SampleResult, new_key, sample
from localchat.backends.mlx.vision.images import load_image_embedder
from localchat.backends.mlx.weights import load_decoder
from localchat.backends.pooling import Pooler
from localchat.engine.interface import BatchInputs, KVCacheSpec, RunnerOutput, SchedulerOutput, StateCacheSpec
from localchat.errors import BackendUnavailableError
from localchat.host_memory import mem_available
from localchat.vision.picture_runs import picture_mask
from localchat.weights.bundle import ModelBundle

if TYPE_CHECKING:
    from localchat.weights.tensors import WeightTensor

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
CPU_KV_FRACTION = 0.25  # of MemAvailable: the KV pool is zero-filled, so it is resident at once
CPU_KV_CAP_BYTES = 1 << 30
GPU_KV_FRACTION = 0.50  # of Metal's recommended working set left after the weights
CPU_DENSE_FROM_ROWS = 8  # see the module docstring; Metal's quantized kernels batch well: never there


def create_runner(model: ModelBundle, options: RunnerOptions) -> MLXRunner:
    if options.isq is not None:
        raise BackendUnavailableError(
            f"--isq {options.isq} is implemented by the torch backend (q8_0 / q4_k / q4_0 on its CPU kernels); MLX "
            "keeps a GGUF file's quantized weights natively. Drop --isq or pass --backend torch."
        )
    return MLXRunner(model, options)


def pick_device(name: str) -> mx.Device:
    if name == "auto":
        return mx.Device(mx.gpu) if mx.metal.is_available() else mx.Device(mx.cpu)
    if name == "cpu":
        return mx.Device(mx.cpu)
    if name in ("gpu", "mps", "metal"):
        if not mx.metal.is_available():
            raise BackendUnavailableError(
                "The MLX backend found no Metal GPU on this machine; use --device cpu (slow) or --backend torch."
            )
        return mx.Device(mx.gpu)
    raise BackendUnavailableError(f"Unknown MLX device {name!r}; use auto, cpu or gpu.")


def pick_dtype(name: str, device: mx.Device, checkpoint_dtype: str | None) -> mx.Dtype:
    if name != "auto":
        if name not in DTYPES:
            raise BackendUnavailableError(f"Unknown dtype {name!r}; use auto, {', '.join(DTYPES)}.")
        return DTYPES[name]
    if device == mx.cpu:
        return mx.float32
    return mx.bfloat16 if checkpoint_dtype == "bfloat16" else mx.float16


def _check_kv_cache_dtype(choice: str, dtype: mx.Dtype) -> None:
    """The MLX cache is kept in the compute dtype: `bf16` only where that is bfloat16; no int8 form."""
    if choice == "auto" or (choice == "bf16" and dtype == mx.bfloat16):
        return
    raise BackendUnavailableError(
        f"--kv-cache-dtype {choice} is not available on the MLX backend, which keeps the KV cache in the "
        f"compute dtype ({str(dtype).removeprefix('mlx.core.')}). Use --kv-cache-dtype auto, or "
        "--backend torch for an int8 KV cache."
    )


class MLXRunner:
    # Hybrid models' verify rows write each position's state into spec rows (state_cache.StepRows.verify,
    # engine/hybrid_spec.py), so speculation works for them too.
    hybrid_speculation = True

    def __init__(self, model: ModelBundle, options: RunnerOptions) -> None:
        self.device = pick_device(options.device)
        mx.set_default_device(self.device)
        self.dtype = pick_dtype(options.dtype, self.device, model.config.torch_dtype)
        _check_kv_cache_dtype(options.kv_cache_dtype, self.dtype)
        self.config = model.config
        dense_from_rows = CPU_DENSE_FROM_ROWS if self.device == mx.cpu else 0
        self.model = load_decoder(model.config, model.iter_weights(), self.dtype, dense_from_rows)
        # The vision tower of a multimodal checkpoint (Gemma 3): images reach the model through it.
        self.images = load_image_embedder(model.path, self.dtype)
        self.key = new_key(options.seed)  # unseeded rows' draws: split once per step that needs them
        self.pooler = Pooler(
            lambda h: np.array(
                mx.fast.rms_norm(h, self.model.norm, self.config.rms_norm_eps).astype(mx.float32).sum(axis=0)
            )
        )
        self.kv_caches: list[LayerCache] = []
        self.block_size = 0
        self._streams = threading.local()
        # Set by `mtp_proposer`: each step's last hidden states (before the final norm) go to the head.
        self.hidden_sink: Callable[[BatchInputs, mx.array], None] | None = None

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        c = self.config
        return KVCacheSpec(self._num_kv_layers, c.num_key_value_heads, c.head_dim, self.dtype.size)

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
        self.model.initialize_state_cache(num_slots, self.dtype)  # type: ignore[attr-defined]

    @property
    def device_name(self) -> str:
        kind = "metal" if self.device == mx.gpu else "cpu"
        return f"mlx {kind} ({str(self.dtype).removeprefix('mlx.core.')})"

    def available_kv_memory(self) -> int | None:
        if self.device == mx.gpu:
            info = mx.device_info()
            budget = int(info.get("max_recommended_working_set_size", 0)) - mx.get_active_memory()
            return max(0, int(budget * GPU_KV_FRACTION))
        available = mem_available()
        # MLX commits its zero-filled pool up front (torch's CPU pool is lazy), so cap it on CPU.
        return None if available is None else min(int(available * CPU_KV_FRACTION), CPU_KV_CAP_BYTES)

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        c = self.config
        shape = (num_blocks * block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = []  # drop the old pool first: its memory is reused
        caches = [
            LayerCache(mx.zeros(shape, dtype=self.dtype), mx.zeros(shape, dtype=self.dtype))
            for _ in range(self._num_kv_layers)
        ]
        mx.eval([a for cache in caches for a in (cache.k, cache.v)])
        self.kv_caches = caches
        self.block_size = block_size

    def prepare_decode_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Engine hook once the context bound is known: MLX captures no graphs, but longrope models fix
        their RoPE table for the served context here (localchat/arch/rope.py)."""
        self.model.rotary.serve_context(max_model_len)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        with self._thread_stream():
            self._update_states(scheduler_output)
            if scheduler_output.is_empty or batch.num_tokens == 0:
                return RunnerOutput(req_ids=[], sampled_token_ids=[])
            logits = self._logits(batch)
            if logits is None:  # only middle prefill chunks: the KV writes are the whole step
                return RunnerOutput(req_ids=[], sampled_token_ids=[])
            embeddings = self.pooler.finish(batch.sample_req_ids)
            # Embedding rows got logits too (one LM-head row each) but do not sample.
            rows = [i for i, r in enumerate(batch.sample_req_ids) if r not in embeddings]
            sample_ids = [batch.sample_req_ids[i] for i in rows]
            assert batch.sampling is not None, "the engine builds sampling inputs for every sampled row"
            inputs = batch.sampling
            if embeddings:
                logits, inputs = logits[mx.array(rows, dtype=mx.int32)], inputs.take(rows)
            result = SampleResult([])
            if sample_ids:
                result, self.key = sample(logits, inputs, self.key)
        output = RunnerOutput.one_token_each(sample_ids, result.token_ids, result.logprobs)
        return output.with_embeddings(batch.sample_req_ids, embeddings)

    def mtp_proposer(
        self, weights: Iterable[WeightTensor], target_name: str, token_limit: int
    ) -> MtpProposer:
        """`--speculative mtp`: the checkpoint's own multi-token-prediction head (its `mtp.*` tensors among
        `weights`), fed this runner's last hidden states from now on (mtp_proposer.py)."""
        return attach_mtp(self, weights, target_name, token_limit)

    def compute_logits(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> mx.array:
        """Like `execute_model` but returns the float32 logits [num_sampled, vocab] (tests, debugging)."""
        with self._thread_stream():
            self._update_states(scheduler_output)
            logits = self._logits(batch)
            out = mx.zeros((0, self.config.vocab_size)) if logits is None else logits.astype(mx.float32)
            mx.eval(out)
            return out

    def shutdown(self) -> None:
        self.kv_caches = []
        mx.clear_cache()

    @contextlib.contextmanager
    def _thread_stream(self) -> Iterator[None]:
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = mx.new_stream(self.device)
        with mx.stream(stream):
            yield

    def _update_states(self, out: SchedulerOutput) -> None:
        # Only pooling keeps per-request state; sampling gets everything from BatchInputs.sampling.
        # Forget first: a preempted request comes back in the same step as a new one.
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.pooler.forget(req_id)
        for new in out.scheduled_new_reqs:
            if new.sampling_params.embedding:
                self.pooler.start(new.req_id)

    @property
    def pictures_both_ways(self) -> bool:
        """Whether the model attends over each picture's tokens both ways (Gemma 3; Gemma 4 "vision"): the
        engine then never cuts a picture across prefill chunks."""
        return self.images is not None and bool(getattr(self.model, "pictures_both_ways", False))

    def _logits(self, batch: BatchInputs) -> mx.array | None:
        """Run the step (writing its K/V) and return logits [num_sampled, vocab], evaluated; None if none."""
        assert self.kv_caches and batch.block_size == self.block_size, "initialize_kv_cache first"
        if batch.kv_copies:  # partial prefix reuse: before anything of this step writes the cache
            src, dst = (mx.array(a.astype(np.int32)) for a in batch.kv_copy_slots())
            for cache in self.kv_caches:  # a scatter into the donated buffer, as the step's writes
                cache.k[dst] = cache.k[src]
                cache.v[dst] = cache.v[src]
        if batch.state_copies and (states := getattr(self.model, "states", None)) is not None:
            states.copy_slots(batch.state_copies)  # hybrid prefix checkpoints, before begin_step's zeroing
        meta = AttentionMetadata.from_batch(batch)
        if batch.image_slices and self.pictures_both_ways:  # Gemma 3: a picture's tokens see all of it
            for row in meta.prefills:
                if (mask := picture_mask(batch, row.start, row.end, row.seq_len)) is not None:
                    row.picture_mask = mx.array(mask)
        input_ids = mx.array(batch.input_ids.astype(np.int32))
        # M-RoPE (vision/mrope.py): [3, T] rotary positions when a row has pictures; K/V follow `positions`.
        rope = batch.positions if batch.rope_positions is None else batch.rope_positions
        positions = mx.array(rope.astype(np.int32))
        if (begin_step := getattr(self.model, "begin_step", None)) is not None:  # hybrid: bind state slots
            begin_step(
                batch.state_slots, batch.query_start_loc, batch.positions, self.dtype, batch.state_keep
            )
        hooked: Any = self.model  # only models with the image hook (models/gemma.py) get a tower
        if batch.image_slices:
            assert self.images is not None, "image input reached a model without a vision tower"
            hooked.image_embeds = self.images.step_embeds(batch.image_slices)
        try:
            hidden = self.model.hidden_states(input_ids, positions, meta, self.kv_caches)
        finally:
            if batch.image_slices:
                hooked.image_embeds = None
        if pooled := self.pooler.rows(batch):
            self.pooler.add(batch, hidden, pooled)
        cache_arrays = [a for cache in self.kv_caches for a in (cache.k, cache.v)]
        if self.hidden_sink is not None:  # an MTP head reads every row (mtp_proposer.py): evaluated now
            self.hidden_sink(batch, hidden)
            cache_arrays.append(hidden)
        if (state_arrays := getattr(self.model, "state_arrays", None)) is not None:
            cache_arrays += state_arrays()  # the hybrid layers' states: written this step as well
        indices = batch.logits_indices
        if len(indices) == 0:
            mx.eval(cache_arrays)
            return None
        if not (len(indices) == batch.num_tokens and np.array_equal(indices, np.arange(len(indices)))):
            hidden = hidden[mx.array(indices.astype(np.int32))]
        logits = self.model.logits(hidden)
        mx.eval(logits, cache_arrays)
        return logits
