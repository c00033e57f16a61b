#!/usr/bin/env bash
# The second device call: the job's own loop (transformers' flex path, the shipped default) under
# torchrun on 511-byte documents, then the bench's isolated-flex loop of the same shape, one machine.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python - <<'PY'
import json, random
random.seed(0)
words = ["river", "bread", "light", "market", "wheel", "stone", "north", "cloud", "field", "copper"]
with open("/tmp/docs.jsonl", "w") as handle:
    for _ in range(2000):
        text = " ".join(random.choice(words) for _ in range(120))[:511].ljust(511, ".")
        handle.write(json.dumps({"text": text}) + "\n")
PY
timeout 110 torchrun --standalone --nproc-per-node=1 -m training --launcher torchrun --preset throughput \
  --init random --tokenizer bytes --data /tmp/docs.jsonl --seq-len 4096 --batch-size 6 --steps 12 \
  --hsdp-replicas 1 --no-activation-checkpointing --no-reshard-after-forward --no-tensorboard \
  --storage-path /tmp/runs --run-name job-default 2>&1 | grep -v Warning > "$OUT/job-default.log"
tail -2 "$OUT/job-default.log"; cp /tmp/runs/job-default/summary.json "$OUT/job-default-summary.json"
timeout 100 python -m bench.train_bench --out "$OUT/bench-default.json" --steps 8 --skip-reference --memory-cases \
  --naive --variants tuned-compiled-isolated-flex-4096x6 2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -3
