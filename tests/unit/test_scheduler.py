"""Token-budget scheduler, CPU-exact: chunked prefill, decode-first, max_num_seqs, preemption, abort."""

from __future__ import annotations

from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.request import FinishReason, Request, RequestStatus
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler

BS = 4


def make(num_blocks: int = 32, **config: int) -> Scheduler:
    cfg = EngineConfig(block_size=BS, watermark_fraction=0.0, **config)  # type: ignore[arg-type]
    return Scheduler(cfg, BlockManager(num_blocks, BS))


def req(req_id: str, n: int, base: int = 0, max_tokens: int = 8) -> Request:
    return Request(req_id, [base + i for i in range(n)], SamplingParams(max_tokens=max_tokens))


def complete_step(s: Scheduler, out, token: int = 7) -> None:  # type: ignore[no-untyped-def]
    """What the engine does after the runner: advance computed counts, append sampled tokens."""
    batch = build_batch(out, s.requests, BS)
    for req_id, count in out.num_scheduled_tokens.items():
        s.requests[req_id].num_computed_tokens += count
    for req_id in batch.sample_req_ids:
        s.requests[req_id].append_output_token(token)


def test_prefill_is_chunked_to_the_chunk_size_then_decodes() -> None:
    s = make(max_num_batched_tokens=100, prefill_chunk_size=8)
    s.add_request(req("a", 20))
    steps = []
    for _ in range(4):
        out = s.schedule()
        steps.append(out.num_scheduled_tokens["a"])
        batch = build_batch(out, s.requests, BS)
        steps.append(batch.sample_req_ids)
        complete_step(s, out)
    assert steps == [8, [], 8, [], 4, ["a"], 1, ["a"]]


def test_budget_serves_running_decodes_before_new_prefills() -> None:
    s = make(max_num_batched_tokens=10, prefill_chunk_size=0)
    s.add_request(req("a", 6))
    complete_step(s, s.schedule())  # a prefilled, now decoding
    s.add_request(req("b", 6, base=100))
    s.add_request(req("c", 4, base=200))
    out = s.schedule()
    # a decodes (1 token); b's unchunked 6-token prefill fits the remaining 9; c's 4 do not fit in 3.
    assert out.num_scheduled_tokens == {"a": 1, "b": 6}
    assert [r.req_id for r in out.scheduled_new_reqs] == ["b"]
    assert [r.req_id for r in out.scheduled_cached_reqs] == ["a"]


def test_budget_chunks_a_new_prefill_into_what_is_left() -> None:
    s = make(max_num_batched_tokens=10, prefill_chunk_size=64)
    s.add_request(req("a", 6))
    complete_step(s, s.schedule())
    s.add_request(req("b", 30, base=100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}


def test_max_num_seqs_caps_running_requests() -> None:
    s = make(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add_request(req(f"r{i}", 4, base=10 * i))
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]
    assert [r.req_id for r in s.waiting] == ["r2"]


def test_preemption_takes_the_newest_and_requeues_it_first() -> None:
    # 4 usable blocks of 4 tokens; a and b take 2 each for their 8-token prompts.
    s = make(num_blocks=5, max_num_batched_tokens=100)
    s.add_request(req("a", 8, base=0, max_tokens=20))
    s.add_request(req("b", 8, base=100, max_tokens=20))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 8, "b": 8}
    complete_step(s, out)
    assert s.block_manager.num_free_blocks == 0
    # Decode step: a needs a 3rd block -> b (newest) is preempted, freeing its blocks; a gets one.
    out = s.schedule()
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1}
    b = s.waiting[0]
    assert b.req_id == "b" and b.status == RequestStatus.WAITING
    assert b.num_computed_tokens == 0 and b.block_ids == [] and b.num_preemptions == 1
    assert b.output_token_ids == [7]  # kept: resumes with prompt + outputs recomputed


def test_preempted_request_resumes_with_its_outputs_and_a_prefix_hit() -> None:
    s = make(num_blocks=5, max_num_batched_tokens=100)
    s.add_request(req("a", 8, base=0, max_tokens=2))
    s.add_request(req("b", 8, base=100, max_tokens=20))
    complete_step(s, s.schedule())
    out = s.schedule()  # b preempted
    complete_step(s, out)
    s.finish_request(s.requests["a"], FinishReason.LENGTH)
    out = s.schedule()
    (new,) = out.scheduled_new_reqs
    assert new.req_id == "b" and new.output_token_ids == [7]
    # b's blocks were freed tail first, so a's new block evicted b's second block; the first still hits.
    assert new.num_computed_tokens == 4
    assert out.num_scheduled_tokens == {"b": 5}  # 4 prompt tokens + its 1 output token recomputed
    assert out.finished_req_ids == {"a"}


def test_a_lone_request_that_cannot_grow_preempts_itself_and_waits() -> None:
    s = make(num_blocks=3, max_num_batched_tokens=100)  # 2 usable blocks = 8 tokens
    s.add_request(req("a", 8, max_tokens=20))
    complete_step(s, s.schedule())
    out = s.schedule()
    assert out.preempted_req_ids == {"a"} and out.num_scheduled_tokens == {}
    assert s.waiting[0].req_id == "a"


def test_abort_frees_blocks_and_is_reported_to_the_runner() -> None:
    s = make()
    s.add_request(req("a", 9))
    s.add_request(req("b", 3, base=50))
    complete_step(s, s.schedule())
    used = s.block_manager.num_used_blocks
    s.finish_request(s.requests["a"], FinishReason.ABORT)
    assert s.block_manager.num_used_blocks == used - 3
    assert "a" not in s.requests
    out = s.schedule()
    assert out.finished_req_ids == {"a"}
    assert list(out.num_scheduled_tokens) == ["b"]


def test_abort_of_a_waiting_request_removes_it() -> None:
    s = make(max_num_seqs=1)
    s.add_request(req("a", 3))
    s.add_request(req("b", 3, base=10))
    s.schedule()
    s.finish_request(s.requests["b"], FinishReason.ABORT)
    assert not s.waiting and [r.req_id for r in s.running] == ["a"]


def test_batch_inputs_layout_for_mixed_prefill_and_decode() -> None:
    s = make(max_num_batched_tokens=100)
    s.add_request(req("a", 5))
    complete_step(s, s.schedule())  # a: 5 computed + 1 sampled
    s.add_request(req("b", 6, base=100))
    out = s.schedule()
    batch = build_batch(out, s.requests, BS)
    a, b = s.requests["a"], s.requests["b"]
    assert batch.req_ids == ["a", "b"]
    assert batch.input_ids.tolist() == [7, 100, 101, 102, 103, 104, 105]
    assert batch.positions.tolist() == [5, 0, 1, 2, 3, 4, 5]
    assert batch.query_start_loc.tolist() == [0, 1, 7]
    assert batch.seq_lens.tolist() == [6, 6]
    assert batch.block_tables.tolist() == [a.block_ids, b.block_ids]
    expected_slots = [a.block_ids[1] * BS + 1] + [b.block_ids[p // BS] * BS + p % BS for p in range(6)]
    assert batch.slot_mapping.tolist() == expected_slots
    assert batch.logits_indices.tolist() == [0, 6] and batch.sample_req_ids == ["a", "b"]
    assert not batch.is_decode_only and batch.max_query_len == 6
