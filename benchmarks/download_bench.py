"""Model manager benchmark: download throughput of `localchat pull` against plain `curl` on the same
file from the same fake hub (tests/helpers/fake_hub.py on 127.0.0.1), and the time from `pull` start
to the first generated token for a model already on disk.

python benchmarks/download_bench.py [--file FILE] [--rounds 3] [--link-mbs 50] [--no-first-token]

FILE defaults to $LOCALCHAT_TEST_GGUF (the SmolLM2 GGUF), so the first-token part runs a real model.
Rounds alternate pull / curl; the table gives each side's best and median, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat import hub

REPO_ROOT = Path(__file__).resolve().parent.parent

REPO = "bench/Model-GGUF"


def time_pull(name: str, cache: Path) -> float:
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    hub.pull(name)
    return time.perf_counter() - started


def time_curl(url: str, out: Path) -> float:
    out.unlink(missing_ok=True)
    started = time.perf_counter()
    subprocess.run(["curl", "-sS", "-L", "-o", str(out), url], check=True)
    return time.perf_counter() - started


def first_token_s(name: str) -> tuple[float, float, float]:
    """pull (already on disk) -> load -> one generated token, in this process: the three durations."""
    from localchat import LLM, SamplingParams

    started = time.perf_counter()
    path = hub.pull(name).path
    pulled = time.perf_counter()
    llm = LLM(path)
    loaded = time.perf_counter()
    ids = llm.apply_chat_template([{"role": "user", "content": "Hi"}])
    llm.engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1))
    while llm.engine.has_unfinished:
        if any(out.new_token_ids for out in llm.engine.step()):
            break
    return pulled - started, loaded - pulled, time.perf_counter() - loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--file", default=os.environ.get("LOCALCHAT_TEST_GGUF"), help="the GGUF file to serve"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--link-mbs", type=float, help="throttle the fake hub to this many MB/s (a real link)"
    )
    parser.add_argument("--no-first-token", action="store_true", help="skip the load + first token part")
    args = parser.parse_args()
    if not args.file:
        parser.error("pass --file FILE or set LOCALCHAT_TEST_GGUF")
    source = Path(args.file)
    work = Path(tempfile.mkdtemp(prefix="download-bench-"))
    # The hub runs in its own process, as a real server would: in this one it would share our GIL.
    throttle = ["--throttle", str(int(args.link_mbs * 1e6))] if args.link_mbs else []
    fake = subprocess.Popen([sys.executable, "-m", "tests.helpers.fake_hub", *throttle, REPO, str(source)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert fake.stdout is not None
        endpoint = fake.stdout.readline().strip()
        os.environ.update(
            HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(work / "cache"), LOCALCHAT_HOME=str(work / "home")
        )
        name = f"{REPO}:{source.name}"
        url = f"{endpoint}/{REPO}/resolve/main/{source.name}"
        size = source.stat().st_size
        pulls, curls = [], []
        for _ in range(args.rounds):  # alternate, so a noisy neighbour hurts both sides alike
            pulls.append(time_pull(name, work / "cache"))
            curls.append(time_curl(url, work / "curl.out"))
        link = f"throttled to {args.link_mbs:g} MB/s" if args.link_mbs else "unthrottled"
        print(
            f"{source.name}: {size / 1e6:.1f} MB from the fake hub on 127.0.0.1 ({link}), {args.rounds} rounds"
        )
        print("| client | best MB/s | median MB/s |")
        print("|---|---|---|")
        for label, times in (("localchat pull (sha256 checked)", pulls), ("curl -L", curls)):
            print(
                f"| {label} | {size / min(times) / 1e6:.0f} | {size / statistics.median(times) / 1e6:.0f} |"
            )
        print(
            f"| ratio pull / curl (medians) | | {statistics.median(curls) / statistics.median(pulls):.2f} |"
        )
        if not args.no_first_token:
            pull_s, load_s, token_s = first_token_s(name)
            print(f"\npull start -> first token, model already on disk: {pull_s + load_s + token_s:.2f} s "
                  f"(pull {pull_s * 1000:.0f} ms, load {load_s:.2f} s, first token {token_s:.2f} s)")  # fmt: skip
    finally:
        fake.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
