#!/bin/bash
# The real-GPU check of issue 26, run on a lent GPU machine from the repository root with the
# carried wheels (.whl: pydantic, textual... that machine lacks); everything lands in $OUT.
#   bash bench/device_check.sh            (OUT defaults to bench/out/device)
OUT=${OUT:-bench/out/device}
mkdir -p "$OUT"
if [ -z "$SKIP_WHEELS" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
export HWDASH_RUNS=$OUT/runs.jsonl HWDASH_PRICE=5.0 XDG_STATE_HOME=$OUT/state
export XDG_RUNTIME_DIR=/tmp/xdg-hwdash XDG_DATA_HOME=$OUT/data
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
PY=${PY:-python3}
(nvidia-smi; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv) > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__, torch.cuda.is_available())" > "$OUT/versions.txt" 2>&1
timeout 60 $PY -m hwdash monitor --once --json > "$OUT/monitor_once.json" 2> "$OUT/monitor_once.err"
timeout 60 $PY -m hwdash monitor --once > "$OUT/monitor_once.txt" 2>&1
# The monitor beside the runs: processes[].run as the JSON stream shows it.
timeout "${MONITOR_S:-330}" $PY -m hwdash monitor --json --interval 1 --price 5 \
  > "$OUT/monitor_stream.jsonl" 2> "$OUT/monitor_stream.err" &
MON=$!
timeout "${RUNS_S:-300}" $PY bench/gpu_runs.py --out "$OUT/gpu" --steps "${STEPS:-12}" ${GPU_ARGS} 2>&1 | tee "$OUT/gpu_runs.log"
timeout 90 $PY bench/probe_gpu_check.py --steps "${PROBE_STEPS:-200}" > "$OUT/probe_gpu_check.json" 2> "$OUT/probe_gpu_check.err"
kill $MON 2>/dev/null
$PY -m hwdash runs --json > "$OUT/runs.json" 2>&1
$PY -m hwdash runs > "$OUT/runs.txt" 2>&1
PLAN="--model qwen2.5-0.5b --method lora --batch 4 --seq 1024 --tokens 100000000"
$PY -m hwdash plan $PLAN > "$OUT/plan_plain.txt" 2>&1
$PY -m hwdash plan $PLAN --calibrated > "$OUT/plan_calibrated.txt" 2>&1
$PY -m hwdash plan $PLAN --calibrated --json > "$OUT/plan_calibrated.json" 2>&1
$PY -m hwdash report --since 1h -o "$OUT/report.md" > "$OUT/report.err" 2>&1
ls -la "$OUT" "$OUT/gpu"
