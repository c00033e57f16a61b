#!/usr/bin/env bash
# The third device call, on the machine of the second: the job's own loop (`python -m training` under
# torchrun) at the bench's isolated-flex shape, on a corpus of 512-token documents, beside the bench's
# figure of the call before; then float8 against bf16 over 120 steps of real text, with a second bf16
# seed for the spread a float8 difference must stay inside.
set -o pipefail
export PYTHONUNBUFFERED=1
python -c "import torchao" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch, torchao; print(torch.__version__, torchao.__version__)"
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$MIB" -gt 100000 ]; then SHAPE="--batch-size 10 --grad-accum-steps 8 --defer-grad-sync" STEPS=8
else SHAPE="--batch-size 4 --grad-accum-steps 4 --defer-grad-sync" STEPS=8; fi
python - <<'PY'
import glob, json, os, random
random.seed(0)
words = ["river", "bread", "light", "market", "wheel", "stone", "north", "cloud", "field", "copper"]
with open("/tmp/docs.jsonl", "w") as handle:
    for _ in range(7000):
        text = " ".join(random.choice(words) for _ in range(120))[:511].ljust(511, ".")
        handle.write(json.dumps({"text": text}) + "\n")
# Real text for the float8 parity: the image's transformers modeling files, split at blank lines.
import transformers
os.makedirs("/tmp/corpus", exist_ok=True)
files = sorted(glob.glob(os.path.join(os.path.dirname(transformers.__file__), "models/*/modeling_*.py")))[:80]
with open("/tmp/corpus/docs.jsonl", "w") as handle:
    for path in files:
        for piece in open(path).read().split("\n\n\n"):
            if len(piece) > 200:
                handle.write(json.dumps({"text": piece}) + "\n")
PY
timeout 200 torchrun --standalone --nproc-per-node=1 -m training --launcher torchrun --preset throughput \
  --init random --tokenizer bytes --data /tmp/docs.jsonl --seq-len 4096 $SHAPE --steps $STEPS \
  --hsdp-replicas 1 --no-activation-checkpointing --no-reshard-after-forward --no-tensorboard \
  --storage-path /tmp/runs --run-name job-mfu 2>&1 | grep -v Warning > "$OUT/job.log"
tail -1 "$OUT/job.log" | cut -c1-400; cp /tmp/runs/job-mfu/summary.json "$OUT/job-summary.json"
timeout 330 python -m bench.train_bench --out "$OUT/float8-parity.json" --steps 8 --skip-reference --naive \
  --memory-cases --variants --float8-parity-steps 120 --parity-data /tmp/corpus/docs.jsonl \
  2>&1 | grep -v "^step \|Warning\|TRAIN_STEP" | tail -4
