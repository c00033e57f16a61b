#!/usr/bin/env bash
# The second device call: the first call's accumulation at 6 rows ran out of memory and expandable
# segments slowed the step; here the rows a step holds (4, 5, 6) and accumulation under the memory
# they leave, each variant with the allocator's retries counted; then the step at 4096 x 6 profiled
# with the shard-local optimizer in (the lever that landed).
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
FLEX=tuned-compiled-isolated-flex
timeout 360 python -m bench.train_bench --out "$OUT/shapes.json" --steps 8 --skip-reference --memory-cases --naive \
  --variants $FLEX-4096x6 $FLEX-4096x5 $FLEX-4096x4 tuned-compiled-accum2-isolated-flex-4096x5 \
  tuned-compiled-accum2-deferred-isolated-flex-4096x5 tuned-compiled-accum4-deferred-isolated-flex-4096x4 \
  2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -8
timeout 170 python -m bench.profile_step --out /tmp/profile --seq-len 4096 --batch-size 6 \
  --loops tuned-compiled-isolated-flex --warmup 3 --steps 3 2>&1 | grep -v Warning | tail -40
cp /tmp/profile/profile.json "$OUT/profile-4096x6.json"
