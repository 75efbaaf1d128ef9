#!/usr/bin/env bash
# The one prepared GPU check (issue: CUDA backend), under 8 minutes on an H100:
#   1. the gpu-marked tests, and the parity + batch-invariance suites on CUDA (fp32, vs transformers);
#   2. benchmarks/gpu_bench.py on a Llama-3-8B-shaped model with random weights, bf16 (with HF
#      transformers as the peer) and 4-bit (GGUF Q4_0 blocks kept 4-bit on the GPU).
#
# The GPU machine has torch, triton, transformers and pytest but no network: prepare here first with
#   bash benchmarks/gpu_wheels.sh            # the few wheels it lacks, into .whl/ (git-ignored)
# then run through the device tool with carry [".whl"] and the command
#   bash benchmarks/gpu_check.sh
# The real model (SmolLM2 GGUF, 94 MiB) is over the tool's 64 MiB per-call transfer, so it travels in
# two parts (split -b 52M -d FILE .gpu_model/part; its sha256 in .gpu_model/sha256): carry
# .gpu_model/part00 in a first short call that moves it to /tmp, then .gpu_model/part01 and
# .gpu_model/sha256 with this script. Without a verified model the two tests that need it are left out.
# Everything printed also goes to $OUT/gpu_check.log when $OUT is set (the device tool's output folder).
# Arguments pick parts (default: tests attention bench): tests, gputests (test_gpu.py alone), attention,
# bench, int4 (the 4-bit matmuls across step sizes), q4 (the 8B 4-bit benchmark under each 4-bit kernel),
# profile (where a decode step's time goes, bf16 and 4-bit; PROFILE_QUANTS narrows it), gpu-layers
# (the CPU + GPU layer split: its test, then decode/prefill speed as layers move to the GPU), pp and tp
# (PP=2 / TP=2 over NCCL against one device; they need two GPUs and say so on one).
set -uo pipefail
cd "$(dirname "$0")/.."
parts=" ${*:-tests attention bench} "
want() { [[ $parts == *" $1 "* ]]; }
log=${OUT:-test-output}/gpu_check.log
mkdir -p "$(dirname "$log")"
exec > >(tee "$log") 2>&1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
gguf_file=$(ls .models/*.gguf 2>/dev/null | head -n 1)
if [ -z "$gguf_file" ] && [ -f .gpu_model/sha256 ]; then
  for name in part00 part01; do  # each part from this call's tree, else from the first call's /tmp
    if [ -f .gpu_model/$name ]; then cat .gpu_model/$name; else cat /tmp/lc_$name 2>/dev/null; fi
  done >/tmp/model.gguf
  if [ "$(sha256sum /tmp/model.gguf | cut -d' ' -f1)" = "$(cat .gpu_model/sha256)" ]; then
    gguf_file=/tmp/model.gguf
  else
    echo "model parts incomplete: the tests that need the real model are left out"
  fi
fi
deselect=(--deselect tests/backends/test_gpu.py::test_parity_suite_passes_on_cuda)  # run directly below
if [ -n "$gguf_file" ]; then
  export LOCALCHAT_TEST_GGUF=$(realpath "$gguf_file")
else
  deselect+=(--deselect tests/backends/test_gpu.py::test_cuda_graphs_on_and_off_give_identical_greedy_tokens
             --deselect tests/backends/test_gpu.py::test_kv_sizing_after_warmup_fits_the_device)
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

tests_rc=0
SECONDS=0
if want tests; then
  echo "== gpu tests, parity and invariance on CUDA =="
  LOCALCHAT_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider -o addopts="" "${deselect[@]}" \
    -m "not mlx" tests/backends/test_gpu.py tests/backends/test_parity.py \
    "tests/backends/test_runner_invariance.py::test_batch_invariance_and_preemption_tiny[torch]"
  tests_rc=$?
  echo "(tests: ${SECONDS}s)"
fi
if want gputests; then  # the gpu-marked file alone (the parity suite takes a minute more)
  echo "== gpu tests =="
  timeout 150 python3 -m pytest -q -rfEs -p no:cacheprovider -o addopts="" "${deselect[@]}" tests/backends/test_gpu.py
  tests_rc=$?
  echo "(gpu tests: ${SECONDS}s)"
fi
if want attention; then
  echo "== paged decode attention: Triton vs the gather path vs flash-attn (if installed) =="
  timeout 40 python3 benchmarks/attention_bench.py
fi
if want int4; then
  echo "== 4-bit matmul across step sizes (${SECONDS}s) =="
  timeout 120 python3 benchmarks/gpu_int4_bench.py
fi
if want profile; then
  echo "== decode step breakdown (${SECONDS}s) =="
  for quant in ${PROFILE_QUANTS:-bf16 q4_0}; do
    timeout 90 python3 benchmarks/gpu_step_profile.py --shape llama3-8b --quant "$quant" --prompt 2048
  done
fi
if want gpu-layers; then
  echo "== --gpu-layers: the CPU + GPU split against the CPU, then its speed (${SECONDS}s) =="
  timeout 180 python3 -m pytest -q -rfEs -p no:cacheprovider -o addopts="" tests/backends/test_gpu_parallel.py -k gpu_layers
  tests_rc=$((tests_rc || $?))
  timeout 240 python3 benchmarks/gpu_layers_bench.py --shape llama3.2-1b --layers 16 12 8 4 0
fi
for mode in pp tp; do
  if want $mode; then
    flag=$([ $mode = pp ] && echo pipeline_parallel_size || echo tensor_parallel_size)
    echo "== $mode=2 over NCCL against one device ($(python3 -c 'import torch; print(torch.cuda.device_count())') GPUs; skipped below 2) (${SECONDS}s) =="
    timeout 150 python3 -m pytest -q -rfEs -p no:cacheprovider -o addopts="" tests/backends/test_gpu_parallel.py -k "nccl and $flag"
    tests_rc=$((tests_rc || $?))
  fi
done
if want bench; then
  echo "== benchmark: bf16 (with transformers) (${SECONDS}s) =="
  timeout 170 python3 benchmarks/gpu_bench.py --shape llama3-8b --quant bf16 --peer --new-tokens 128
  echo "== benchmark: 4-bit (Q4_0 blocks) (${SECONDS}s) =="
  timeout 110 python3 benchmarks/gpu_bench.py --shape llama3-8b --quant q4_0 --new-tokens 128
fi
if want q4; then  # the two 4-bit CUDA kernels on the same machine
  for kernel in triton tinygemm; do
    echo "== benchmark: 4-bit (Q4_0 blocks), LOCALCHAT_CUDA_INT4=$kernel (${SECONDS}s) =="
    LOCALCHAT_CUDA_INT4=$kernel timeout 120 python3 benchmarks/gpu_bench.py --shape llama3-8b --quant q4_0 --new-tokens 128
  done
fi
echo "(in all: ${SECONDS}s)"
exit $tests_rc
