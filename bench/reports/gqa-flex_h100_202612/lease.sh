#!/usr/bin/env bash
# The device call of this report: the grouped-query flex checks, the bench's loops in one process
# (naive and tuned causal baselines, transformers' repeated-heads flex, the grouped flex, more rows),
# then the job's own loop under torchrun on a corpus of 512-token documents. Each JSON lands in $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
# An H200's shapes; an H100 (80 GiB) runs NAIVE=naive-compiled-4096x2 BASE_BATCH=6 BATCHES="6 7".
NAIVE=${NAIVE:-naive-compiled-4096x4}
BASE_BATCH=${BASE_BATCH:-12}
BATCHES=${BATCHES:-12}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
timeout 100 python -m bench.flex_checks --out "$OUT/flex-checks-gqa.json" --checks isolation grouped-heads 2>&1 | grep -v Warning | tail -4
VARIANTS="tuned-compiled-4096x$BASE_BATCH tuned-compiled-isolated-flex-repeat-kv-4096x$BASE_BATCH"
for batch in $BATCHES; do VARIANTS="$VARIANTS tuned-compiled-isolated-flex-4096x$batch"; done
timeout 330 python -m bench.train_bench --out "$OUT/bench-gqa.json" --steps 8 --skip-reference --memory-cases \
  --naive "$NAIVE" --variants $VARIANTS 2>&1 | grep -v "^step \|Warning" | tail -12
# A corpus of 511-byte documents: 512 tokens each with its EOS, as the bench's rows of 8 a row.
python - <<'PY'
import json, random
random.seed(0)
words = ["river", "bread", "light", "market", "wheel", "stone", "north", "cloud", "field", "copper"]
with open("/tmp/docs.jsonl", "w") as handle:
    for _ in range(2000):
        text = " ".join(random.choice(words) for _ in range(120))[:511].ljust(511, ".")
        handle.write(json.dumps({"text": text}) + "\n")
PY
JOB_BATCH=${JOB_BATCH:-12}
timeout 160 torchrun --standalone --nproc-per-node=1 -m training --launcher torchrun --preset throughput \
  --init random --tokenizer bytes --data /tmp/docs.jsonl --seq-len 4096 --batch-size "$JOB_BATCH" --steps 12 \
  --hsdp-replicas 1 --no-activation-checkpointing --no-reshard-after-forward --no-tensorboard \
  --storage-path /tmp/runs --run-name job-gqa 2>&1 | grep -v Warning | tee "$OUT/job-gqa.log" | tail -16
cp /tmp/runs/job-gqa/*.json "$OUT/" 2>/dev/null; ls /tmp/runs/job-gqa
