"""Pipeline stages: a decoder cut into contiguous runs of layers, each run a `StageRunner` of its own.

The first stage holds the embedding (and a vision model's tower: a step's pictures become rows there),
the last the final norm and LM head (and the embedding again when it is the tied LM head); every
stage holds only its layers' weights, K/V and, in hybrid models, state slots. A step runs stage after
stage, one batch in flight (no micro-batches): a stage that is not first takes its input hidden
states from the stage before (`Link.receive`), one that is not last hands its output on
(`Link.send`). The last stage computes the logits and samples; `Results` brings its output to the
stage the engine talks to. The links are torch.distributed send/recv between ranks (pipeline.py) or
a device-to-device copy inside one process (device_split.py, `--gpu-layers`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn

from localchat.arch.architecture import TOP_WEIGHTS
from localchat.arch.gemma4 import kv_sources
from localchat.arch.registry import architecture
from localchat.backends import RunnerOptions
from localchat.backends.torch.kernel_choice import one_step_choice
from localchat.backends.torch.layers import empty_param
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.runner import TorchRunner
from localchat.backends.torch.vision.images import ImageEmbedder
from localchat.backends.torch.weights import load_decoder
from localchat.engine.interface import (
    BatchInputs,
    ImageSlice,
    KVCacheSpec,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
)
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

from .layer_split import stage_kv_layers
from .shard_weights import columns, rows

LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Gemma 4's per-layer embedding table [vocab, layers x ple] and the embedding's projection
# [layers x ple, hidden]: a stage keeps its own layers' part of each.
PER_LAYER_TABLES = {"ple_embed": columns, "ple_projection": rows}


@dataclass(frozen=True, slots=True)
class StagePlan:
    index: int  # this stage's position, from 0
    stages: int
    layers: range  # the model's layer indices this stage holds

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.stages - 1


class Link(Protocol):
    """Hidden states from one stage to the next."""

    def receive(self, tokens: int, hidden: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor: ...

    def send(self, x: torch.Tensor) -> None: ...


class Results(Protocol):
    """The last stage's answer (a RunnerOutput, or logits) to the stage the engine talks to."""

    def deliver(self, value: Any, empty: Any) -> Any:
        """On the last stage: what its call returns (`value`, or `empty` once sent elsewhere)."""
        ...

    def collect(self, empty: Any) -> Any:
        """On the other stages: the last stage's value (where the engine reads it), else `empty`."""
        ...


class StageModel(DecoderLM):
    """Mixed into the family's class: take the input from the stage before, hand the output on."""

    inbound: Link | None
    outbound: Link | None
    # Handed on beside the hidden states (Gemma 4 E2B / E4B: the scaled embeddings the per-layer inputs
    # are projected from, with the pictures' rows), None for every other model.
    carry: torch.Tensor | None = None

    def embed_inputs(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma 4's (layer input, per-layer-input source). With per-layer embeddings, a later stage
        receives both as one [tokens, 2 * hidden] message and each stage makes its own layers' slice:
        2 x hidden values per token cross a boundary, where the slices themselves would be hidden + ple
        x (layers after it): 2.3x (one boundary before layer 13) to 3.3x (before layer 1) more for E2B,
        whose last stage holds at least the 22 layers from its first K/V source on. The per-layer
        table is cut by layer with the stages, not held whole by the first."""
        parent: Any = super()
        if not getattr(self, "ple_width", 0):
            return parent.embed_inputs(input_ids)
        if self.inbound is None:
            x, source = parent.embed_inputs(input_ids)
        else:
            hidden = self.config.hidden_size
            both = self.inbound.receive(input_ids.shape[0], 2 * hidden, self.norm.dtype, input_ids.device)
            x, source = both[:, :hidden], both[:, hidden:]
        self.carry = source
        return x, source

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.inbound is None:
            return super().embed_tokens(input_ids)
        return self.inbound.receive(
            input_ids.shape[0], self.config.hidden_size, self.norm.dtype, input_ids.device
        )

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[Any],
    ) -> torch.Tensor:
        x = super().hidden_states(input_ids, positions, meta, kv_caches)
        carry, self.carry = self.carry, None
        if self.outbound is not None:
            self.outbound.send(x if carry is None else torch.cat((x, carry.to(x.dtype)), dim=-1))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.outbound is not None:  # not the last stage: it has no head
            return hidden.new_empty((hidden.shape[0], 0))
        return super().logits(hidden)


_CLASSES: dict[type, type] = {}


def _stage_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Stage{cls.__name__}", (StageModel, cls), {})
    return _CLASSES[cls]


def stage_weights(
    weights: Iterable[WeightTensor], config: ModelConfig, plan: StagePlan
) -> Iterator[WeightTensor]:
    """The stage's part of the checkpoint: its layers renumbered from 0, the embedding on the first
    stage (and the last when it is the tied LM head), the final norm and LM head on the last."""
    arch = architecture(config.model_type)
    keep_embed = plan.first or (plan.last and config.tie_word_embeddings)
    for w in weights:
        match = LAYER_NAME.fullmatch(w.name)
        if match:
            index = int(match.group(1))
            if index in plan.layers:
                yield replace(w, name=f"model.layers.{index - plan.layers.start}.{match.group(2)}")
            continue
        pname = TOP_WEIGHTS.get(w.name) or arch.top_weights.get(w.name)
        if pname == "embed":
            if keep_embed:
                yield w
        elif pname in ("norm", "lm_head"):
            if plan.last:
                yield w
        elif pname in PER_LAYER_TABLES:  # Gemma 4 E2B / E4B: the stage's layers' columns or rows
            width = int(config.extra["hidden_size_per_layer_input"])
            cut = PER_LAYER_TABLES[pname]
            yield cut(w, plan.layers.start * width, len(plan.layers) * width)
        else:
            yield w  # anything else: load_decoder judges it


def _prepare(plan: StagePlan, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> Any:
    """Cut the empty model down to the stage before any weight arrives."""
    norm_dtype = torch.float32 if "norm" in architecture(config.model_type).float32_params else dtype

    def prepare(model: DecoderLM) -> None:
        model.layers = nn.ModuleList(list(model.layers)[plan.layers.start : plan.layers.stop])
        model.num_kv_layers = stage_kv_layers(config, plan.layers)  # type: ignore[assignment]
        if hasattr(model, "linear_layers"):  # Qwen3-Next / 3.5: its state-slot layers, as stage indices
            setattr(model, "linear_layers", [i for i, layer in enumerate(model.layers) if layer.linear])  # noqa: B010
        if hasattr(model, "cache_index"):  # Gemma 4: the stage's layer kinds, and caches of its K/V owners
            _restage_gemma4(model, config, plan)
        hidden = config.hidden_size
        if not (plan.first or (plan.last and config.tie_word_embeddings)):
            model.embed = nn.Parameter(
                torch.empty(0, hidden, dtype=dtype, device=device), requires_grad=False
            )
        if not plan.last:
            # Never applied: its dtype is the hidden states' (embed_rows, Link.receive read it).
            model.norm = nn.Parameter(
                torch.ones(hidden, dtype=norm_dtype, device=device), requires_grad=False
            )
            model.lm_head = None

    return prepare


@dataclass(frozen=True, slots=True)
class StageCosts:
    """What a stage's own layers cost: K/V per token, state per sequence (hybrids)."""

    kv_layers: int
    kv_bytes_per_token: int
    state_layers: int
    state_bytes_per_slot: int

    def __add__(self, other: StageCosts) -> StageCosts:
        return StageCosts(
            self.kv_layers + other.kv_layers,
            self.kv_bytes_per_token + other.kv_bytes_per_token,
            self.state_layers + other.state_layers,
            self.state_bytes_per_slot + other.state_bytes_per_slot,
        )


NO_COST = StageCosts(0, 0, 0, 0)


def whole_model_specs(stage_kv: KVCacheSpec, total: StageCosts) -> tuple[KVCacheSpec, StateCacheSpec | None]:
    """The engine's view of a staged model: every stage's K/V layers (in `stage_kv`'s element type and
    heads) and every stage's state-slot layers, `total` being the stages' costs summed. A stage may
    hold no K/V layer (a run of DeltaNet or Mamba layers) or no state layer; the engine sizes one pool
    of blocks and one of slots, and every stage allocates both for its own layers."""
    kv = replace(stage_kv, num_layers=total.kv_layers)
    state = StateCacheSpec(total.state_layers, total.state_bytes_per_slot) if total.state_layers else None
    return kv, state


def shared_budget(
    pools: list[tuple[int | None, StageCosts]], kv: KVCacheSpec, state: StateCacheSpec | None
) -> int | None:
    """One byte budget, in the engine's units (`kv`'s bytes per token, `state`'s per slot: the whole
    model's, whole_model_specs), that every memory pool can honour. Pool g (a device, or a rank, with
    the costs of the layers it holds) spends the fraction share_g = max(its K/V share, its state share)
    of whatever the engine buys with a budget, so the budget is min(budget_g / share_g). A pool whose
    budget is unknown (None), or that holds neither K/V nor state (a stage of MLP blocks), sets no
    limit. Rounded down to whole tokens of K/V."""
    kv_unit = kv.bytes_per_block(1)
    state_unit = 0 if state is None else state.bytes_per_slot
    limits = []
    for budget, costs in pools:
        share = max(
            costs.kv_bytes_per_token / kv_unit if kv_unit else 0.0,
            costs.state_bytes_per_slot / state_unit if state_unit else 0.0,
        )
        if budget is not None and share > 0:
            limits.append(int(budget / share))
    if not limits:
        return None
    fewest = min(limits)
    return fewest // kv_unit * kv_unit if kv_unit else fewest


def _restage_gemma4(model: DecoderLM, config: ModelConfig, plan: StagePlan) -> None:
    """Gemma 4's loop zips its layers with `config.extra["layer_types"]` and `cache_index` (the K/V
    cache of each layer's source): both become the stage's (layer_split.stage_runs keeps sources in the stage)."""
    sources = [kv_sources(config)[i] for i in plan.layers]
    owners = sorted(set(sources))
    types = [config.extra["layer_types"][i] for i in plan.layers]
    model.config = replace(config, extra={**config.extra, "layer_types": types})
    setattr(model, "cache_index", [owners.index(source) for source in sources])  # noqa: B010
    model.num_kv_layers = len(owners)  # type: ignore[assignment]
    width = int(config.extra.get("hidden_size_per_layer_input") or 0)
    if width:  # per-layer embeddings: the stage's layers' part of the table and of the projection
        own = len(plan.layers) * width
        vocab = int(config.extra["vocab_size_per_layer_input"])
        setattr(model, "ple_embed", empty_param(vocab, own))  # noqa: B010
        setattr(model, "ple_projection", empty_param(own, config.hidden_size))  # noqa: B010


class StageRunner(TorchRunner):
    """A TorchRunner over one stage's layers; the engine talks to the first stage's runner."""

    def __init__(
        self,
        bundle: ModelBundle,
        options: RunnerOptions,
        plan: StagePlan,
        inbound: Link | None,
        outbound: Link | None,
        results: Results,
    ) -> None:
        self.plan = plan
        self._step_pictures: list[ImageSlice] = []  # a later stage's step: its pictures' runs (masks only)
        super().__init__(bundle, options)
        model = self.model
        model.__class__ = _stage_class(type(model))
        assert isinstance(model, StageModel)
        model.inbound, model.outbound = inbound, outbound
        model.fused_decode = None if outbound is not None or inbound is not None else model.fused_decode
        self.graph_mode = None  # a decode graph would capture the sends and receives
        self.results = results

    def _load_decoder(self, model: ModelBundle) -> DecoderLM:
        config = model.config
        weights = stage_weights(model.iter_weights(), config, self.plan)
        prepare = _prepare(self.plan, config, self.dtype, self.device)
        return load_decoder(config, weights, self.device, self.dtype, self.quant, prepare=prepare)

    def _load_images(self, model: ModelBundle) -> ImageEmbedder | None:
        """Pictures become rows on the first stage only: the others load no vision tower."""
        return super()._load_images(model) if self.plan.first else None

    def own_kv_spec(self) -> KVCacheSpec:
        """This stage's own layers' K/V (what it allocates; none for a stage of state-slot layers)."""
        return super().kv_cache_spec

    def own_state_spec(self) -> StateCacheSpec | None:
        """This stage's own layers' state per sequence (hybrids), None when none keeps a state."""
        return super().state_cache_spec

    def kv_bytes_per_token(self) -> int:
        return self.own_kv_spec().bytes_per_block(1)

    def stage_costs(self) -> StageCosts:
        kv, state = self.own_kv_spec(), self.own_state_spec()
        if state is None:
            return StageCosts(kv.num_layers, kv.bytes_per_block(1), 0, 0)
        return StageCosts(kv.num_layers, kv.bytes_per_block(1), state.num_layers, state.bytes_per_slot)

    @property
    def pictures_both_ways(self) -> bool:
        """Later stages load no tower but attend over each picture as the first does (Gemma 3)."""
        if self.plan.first:
            return super().pictures_both_ways
        return bool(getattr(self.model, "pictures_both_ways", False))

    def _logits(self, batch: BatchInputs) -> torch.Tensor:
        """A step with pictures: the first stage writes their embeddings over the placeholder rows; the
        others get those rows in the hidden states, and the pictures' runs (no pixels) for the masks of
        models that attend over a picture both ways. M-RoPE positions (`rope_positions`) are part of the
        step every stage receives, so each turns its layers' rotary by them."""
        if not batch.image_slices or self.plan.first:
            return super()._logits(batch)
        self._step_pictures = batch.image_slices
        if hasattr(self.model, "picture_rows"):  # Gemma 4: the per-layer table's pad row under them
            under = [row for picture in batch.image_slices for row in picture.token_rows]
            setattr(self.model, "picture_rows", torch.tensor(under, dtype=torch.long, device=self.device))  # noqa: B010
        try:
            return super()._logits(replace(batch, image_slices=[]))
        finally:
            self._step_pictures = []
            if hasattr(self.model, "picture_rows"):
                setattr(self.model, "picture_rows", None)  # noqa: B010

    def _metadata(self, batch: BatchInputs) -> Any:
        if self._step_pictures and self.pictures_both_ways:  # the same picture masks as the first stage
            batch = replace(batch, image_slices=self._step_pictures)
        return super()._metadata(batch)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        empty_output = RunnerOutput(req_ids=[], sampled_token_ids=[])
        idle = scheduler_output.is_empty or batch.num_tokens == 0  # every stage skips it alike
        if self.plan.last:
            output = super().execute_model(scheduler_output, batch)
            return output if idle else self.results.deliver(output, empty_output)
        if idle:
            return empty_output
        self._run_stage(batch)
        return self.results.collect(empty_output)

    def compute_logits(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> torch.Tensor:
        empty = torch.empty(0)
        if self.plan.last:
            return self.results.deliver(super().compute_logits(scheduler_output, batch).cpu(), empty)
        self._run_stage(batch)
        return self.results.collect(empty)

    def _run_stage(self, batch: BatchInputs) -> None:
        """This stage's layers (the model sends their output on); no head, no sampling, no pooling."""
        with torch.inference_mode(), self.settings(), one_step_choice(self.device):
            self._logits(batch)
