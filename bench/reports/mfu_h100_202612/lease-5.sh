#!/usr/bin/env bash
# The fifth device call, on the machine of the fourth: the job's own loop under torchrun at the
# record's shape (8 micro-batches of 4 rows, reduce deferred) on 512-token documents, and the flex
# isolation checks at the code as it stands.
set -o pipefail
export PYTHONUNBUFFERED=1
python - <<'PY'
import json, random
random.seed(0)
words = ["river", "bread", "light", "market", "wheel", "stone", "north", "cloud", "field", "copper"]
with open("/tmp/docs.jsonl", "w") as handle:
    for _ in range(7000):
        text = " ".join(random.choice(words) for _ in range(120))[:511].ljust(511, ".")
        handle.write(json.dumps({"text": text}) + "\n")
PY
timeout 200 torchrun --standalone --nproc-per-node=1 -m training --launcher torchrun --preset throughput \
  --init random --tokenizer bytes --data /tmp/docs.jsonl --seq-len 4096 --batch-size 4 --grad-accum-steps 8 \
  --defer-grad-sync --steps 8 --hsdp-replicas 1 --no-activation-checkpointing --no-reshard-after-forward \
  --no-tensorboard --storage-path /tmp/runs --run-name job-record 2>&1 | grep -v Warning > "$OUT/job-record.log"
tail -1 "$OUT/job-record.log" | cut -c1-300; cp /tmp/runs/job-record/summary.json "$OUT/job-record-summary.json"
timeout 150 python -m bench.flex_checks --out "$OUT/flex-checks.json" --checks isolation 2>&1 | grep -v Warning | tail -4
