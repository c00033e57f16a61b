#!/usr/bin/env bash
# The first device call: each lever alone at 4096 x 6, isolated documents on flex, with the naive and
# tuned causal loops in the same process; then the allocator's expandable segments in a second one
# (the setting is read when CUDA starts). Each JSON lands in $OUT as its variants end.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.nccl.version())"
FLEX=tuned-compiled-isolated-flex
timeout 330 python -m bench.train_bench --out "$OUT/levers.json" --steps 8 --skip-reference --memory-cases \
  --naive naive-compiled-4096x2 --variants tuned-compiled-4096x6 $FLEX-dtensor-adamw-4096x6 $FLEX-4096x6 \
  tuned-compiled-accum2-isolated-flex-4096x6 tuned-compiled-accum4-isolated-flex-4096x6 \
  2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -12
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 230 python -m bench.train_bench \
  --out "$OUT/levers-expandable.json" --steps 8 --skip-reference --memory-cases --naive \
  --variants $FLEX-4096x6 tuned-compiled-accum4-isolated-flex-4096x6 \
  tuned-compiled-accum4-deferred-isolated-flex-4096x5 \
  2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -8
