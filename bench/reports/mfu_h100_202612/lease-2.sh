#!/usr/bin/env bash
# The second device call. On an 80 GiB H100 (the first call's accumulation at 6 rows ran out of
# memory, expandable segments slowed the step): the rows a step holds (4, 5, 6) and accumulation in
# the memory they leave. On a 141 GiB H200 (where no H100 came): the levers at 12 rows and the
# record's accumulation, with both baselines. Each tuned variant counts the allocator's retries.
# Then the step is profiled, the shard-local optimizer in.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.nccl.version())"
FLEX=tuned-compiled-isolated-flex
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$MIB" -gt 100000 ]; then
  OUTFILE=levers-h200.json ROWS=12 STEPS=6
  NAIVE=naive-compiled-4096x4
  VARIANTS="tuned-compiled-4096x12 $FLEX-dtensor-adamw-4096x12 $FLEX-4096x12 tuned-compiled-accum8-deferred-isolated-flex-dtensor-adamw-4096x10 tuned-compiled-accum8-deferred-isolated-flex-4096x10"
else
  OUTFILE=shapes.json ROWS=6 STEPS=8
  NAIVE=
  VARIANTS="$FLEX-4096x6 $FLEX-4096x5 $FLEX-4096x4 tuned-compiled-accum2-isolated-flex-4096x5 tuned-compiled-accum2-deferred-isolated-flex-4096x5 tuned-compiled-accum4-deferred-isolated-flex-4096x4"
fi
timeout 400 python -m bench.train_bench --out "$OUT/$OUTFILE" --steps $STEPS --skip-reference --memory-cases --naive $NAIVE \
  --variants $VARIANTS 2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -8
timeout 150 python -m bench.profile_step --out /tmp/profile --seq-len 4096 --batch-size $ROWS \
  --loops tuned-compiled-isolated-flex --warmup 3 --steps 3 2>&1 | grep -v Warning | tail -40
cp /tmp/profile/profile.json "$OUT/profile-4096x$ROWS.json"
