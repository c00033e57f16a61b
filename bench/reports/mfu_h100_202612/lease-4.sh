#!/usr/bin/env bash
# The fourth device call: the record run. The naive and tuned causal baselines, the isolated-flex
# loop at 5 rows, and the accumulation the second call found fastest (4 micro-batches of 4 rows,
# reduce deferred) beside 8 such micro-batches, all in one process.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.nccl.version())"
timeout 420 python -m bench.train_bench --out "$OUT/record.json" --steps 8 --skip-reference --memory-cases \
  --naive naive-compiled-4096x2 --variants tuned-compiled-4096x6 tuned-compiled-isolated-flex-4096x5 \
  tuned-compiled-accum4-deferred-isolated-flex-4096x4 tuned-compiled-accum8-deferred-isolated-flex-4096x4 \
  2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -8
