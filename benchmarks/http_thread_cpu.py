"""The server's HTTP (event-loop) thread: its CPU time per streamed token, for two or more servers
alternated (#34: on two cores that thread's work is taken from the decode's second core).

python benchmarks/http_thread_cpu.py --gguf .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    --server new=. --server old=/tmp/wt-old [--rounds 8] [--max-tokens 128]

Each `--server NAME=DIR[,http=MODULE:CLASS][,loop=asyncio|uvloop]` runs `python -m localchat serve` from
checkout DIR (a `git worktree` of another commit, with the compiled kernels copied in); `http=` and
`loop=` replace what that checkout passes to `uvicorn.Config`, to compare protocols or loops on one build.
Each round streams one greedy request (`ignore_eos`, so every server decodes the same tokens) to each
server, alternating which goes first, and reads the loop thread's CPU time (the process's main thread:
`/proc/PID/task/PID/schedstat`, nanoseconds) and the whole process's before and after. Prints per round
and the medians: µs of loop-thread CPU per streamed token, process CPU per token, decode tok/s, and the
load average.

`--fake-ms MS` serves the fake backend instead of `--gguf` (no weights: one token per byte of a scripted
reply, MS ms of sleep per step), so nearly all the process's CPU is the HTTP path's; quick and steady for
comparing HTTP-side changes, with the real model's run to confirm. With `BENCH_LOOP_PROFILE=FILE` in a
server's environment (`python benchmarks/http_thread_cpu.py --serve-child serve ...`), SIGUSR1 starts a
cProfile of its loop thread and SIGUSR2 writes it to FILE.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))
from benchmarks.http_vs_llama_server import PROMPT, _wait_healthy, stop_servers  # noqa: E402


@dataclass(slots=True)
class Server:
    name: str
    cwd: Path
    http: str | None
    loop: str | None
    port: int
    proc: subprocess.Popen[bytes] | None = None
    loop_us: list[float] = field(default_factory=list)
    proc_us: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def thread_ns(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def process_ns(pid: int) -> int:
    return sum(thread_ns(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())


def stream(server: Server, model: str, max_tokens: int, fake_ms: int | None = None) -> tuple[int, float]:
    """Tokens streamed and their decode rate (first content chunk to last)."""
    prompt = PROMPT if fake_ms is None else f"<<slow:{fake_ms}>><<say:{'abcdefgh' * (max_tokens // 8 + 1)}>>"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stamps: list[float] = []
    tokens = 0
    with httpx.stream("POST", server.base + "/chat/completions", json=body, timeout=600) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"{server.name} answered {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                tokens = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
            elif line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                stamps.append(time.perf_counter())
    return tokens, (tokens - 1) / (stamps[-1] - stamps[0])


def serve_child() -> None:
    """`--serve-child ARGS...`: the server, with `uvicorn.Config`'s http / loop replaced per the env."""
    import importlib

    import uvicorn

    http, loop = os.environ.get("BENCH_UVICORN_HTTP"), os.environ.get("BENCH_UVICORN_LOOP")
    init = uvicorn.Config.__init__

    def config_init(self: uvicorn.Config, *args: object, **kwargs: object) -> None:
        if http:
            module, _, name = http.partition(":")
            kwargs["http"] = getattr(importlib.import_module(module), name)
        if loop:
            kwargs["loop"] = loop
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    uvicorn.Config.__init__ = config_init  # type: ignore[method-assign]
    from localchat.cli.main import main

    if profile := os.environ.get("BENCH_LOOP_PROFILE"):
        # SIGUSR1 starts a profile of the loop thread (the main thread, where Python runs signal
        # handlers), SIGUSR2 writes it: the streams between, not the start-up. Thread CPU time, so the
        # loop's waits and the engine thread's turns on the GIL do not count.
        import cProfile
        import signal

        prof = cProfile.Profile(time.thread_time)
        signal.signal(signal.SIGUSR1, lambda *_: prof.enable())

        def write(*_: object) -> None:
            prof.disable()
            prof.dump_stats(profile)

        signal.signal(signal.SIGUSR2, write)
    sys.exit(main(sys.argv[2:]))


def parse_server(spec: str, port: int) -> Server:
    name, _, rest = spec.partition("=")
    cwd, *opts = rest.split(",")
    kv = dict(o.split("=", 1) for o in opts)
    return Server(name, Path(cwd).resolve(), kv.get("http"), kv.get("loop"), port)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--fake-ms", type=int, default=None, help="the fake backend, MS ms a step")
    parser.add_argument("--server", action="append", required=True, help="NAME=DIR[,http=M:C][,loop=L]")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--port", type=int, default=8741, help="the first server's; the next ones follow")
    parser.add_argument("--pythonpath", default="", help="prepended to PYTHONPATH (e.g. extra packages)")
    args = parser.parse_args()
    servers = [parse_server(s, args.port + i) for i, s in enumerate(args.server)]
    logs = Path(tempfile.mkdtemp(prefix="http-thread-cpu-"))
    if (args.gguf is None) == (args.fake_ms is None):
        parser.error("one of --gguf FILE or --fake-ms MS")
    model_args = ["--f", str(Path(args.gguf).resolve())] if args.gguf else ["--backend", "fake"]
    try:
        for s in servers:
            env = {**os.environ, "LOCALCHAT_HOME": str(logs / f"home-{s.name}")}
            env["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, str(s.cwd)) if p)
            env |= {"BENCH_UVICORN_HTTP": s.http or "", "BENCH_UVICORN_LOOP": s.loop or ""}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-child", "serve", *model_args]
            cmd += ["--p", str(s.port), "--no-ui", "--log", "warning"]
            log = logs / f"{s.name}.log"
            with log.open("wb") as out:
                s.proc = subprocess.Popen(cmd, cwd=s.cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
            _wait_healthy(s.base, s.proc, log)
        model = {s.name: httpx.get(s.base + "/models", timeout=30).json()["data"][0]["id"] for s in servers}
        for s in servers:
            stream(s, model[s.name], 16, args.fake_ms)  # warm-up
        what = Path(args.gguf).name if args.gguf else f"fake backend, {args.fake_ms} ms a step"
        print(f"{what}: {args.max_tokens} tokens greedy, {args.rounds} rounds")
        for r in range(args.rounds):
            order = servers[r % len(servers) :] + servers[: r % len(servers)]
            for s in order:
                assert s.proc is not None
                pid = s.proc.pid
                loop0, proc0 = thread_ns(pid, pid), process_ns(pid)
                tokens, rate = stream(s, model[s.name], args.max_tokens, args.fake_ms)
                loop1, proc1 = thread_ns(pid, pid), process_ns(pid)
                s.loop_us.append((loop1 - loop0) / 1e3 / tokens)
                s.proc_us.append((proc1 - proc0) / 1e3 / tokens)
                s.rates.append(rate)
                load = Path("/proc/loadavg").read_text().split()[0]
                print(
                    f"round {r + 1} {s.name:>10}: loop thread {s.loop_us[-1]:6.1f} us/token, process "
                    f"{s.proc_us[-1]:7.1f} us/token, {rate:5.1f} tok/s, {tokens} tokens, load {load}",
                    flush=True,
                )
        for s in servers:
            print(
                f"median {s.name:>10}: loop thread {statistics.median(s.loop_us):6.1f} us/token "
                f"(min {min(s.loop_us):.1f}), process {statistics.median(s.proc_us):7.1f} us/token, "
                f"{statistics.median(s.rates):5.1f} tok/s"
            )
    finally:
        stop_servers([s.proc for s in servers if s.proc is not None])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-child"]:
        serve_child()
    else:
        main()
