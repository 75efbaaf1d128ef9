#!/usr/bin/env bash
# The one prepared GPU check (issue: CUDA backend), under 8 minutes on an H100:
#   1. the gpu-marked tests, and the parity + batch-invariance suites on CUDA (fp32, vs transformers);
#   2. benchmarks/gpu_bench.py on a Llama-3-8B-shaped model with random weights, bf16 (with HF
#      transformers as the peer) and 4-bit (GGUF Q4_0 blocks kept 4-bit on the GPU).
#
# The GPU machine has torch, triton, transformers and pytest but no network: prepare here first with
#   bash benchmarks/gpu_wheels.sh            # the few wheels it lacks, into .whl/ (git-ignored)
# then run through the device tool with carry [".whl", ".models"] and the command
#   bash benchmarks/gpu_check.sh
# Everything printed also goes to $OUT/gpu_check.log when $OUT is set (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-test-output}/gpu_check.log
mkdir -p "$(dirname "$log")"
exec > >(tee "$log") 2>&1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
gguf_file=$(ls .models/*.gguf 2>/dev/null | head -n 1)
[ -n "$gguf_file" ] && export LOCALCHAT_TEST_GGUF=$PWD/$gguf_file
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

echo "== gpu tests, parity and invariance on CUDA =="
LOCALCHAT_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/backends/test_gpu.py tests/backends/test_torch_parity.py \
  "tests/backends/test_runner_invariance.py::test_batch_invariance_and_preemption_tiny[torch]"
tests_rc=$?

echo "== paged decode attention: Triton vs the gather path vs flash-attn (if installed) =="
timeout 60 python3 benchmarks/attention_bench.py
echo "== benchmark: bf16 (with transformers) =="
timeout 200 python3 benchmarks/gpu_bench.py --shape llama3-8b --quant bf16 --peer
echo "== benchmark: 4-bit (Q4_0 blocks) =="
timeout 150 python3 benchmarks/gpu_bench.py --shape llama3-8b --quant q4_0
exit $tests_rc
