#!/usr/bin/env bash
# One prepared run for a session that is lent a GPU: measure what no reference dataset has, with
# the kit's own collector, inside a fixed wall-time budget, into OUT_DIR (the device tool's $OUT).
#
#   bash benchmarks/device_session.sh [OUT_DIR]                       # on the GPU machine
#   DEVICE=cpu QUICK=1 PY=.venv/bin/python bash benchmarks/device_session.sh /tmp/out  # dry run
#
# Environment: DEVICE (cuda), QUICK (tiny grids), PY (python3), BUDGET (540: seconds of wall time
# for the whole script, packing included; run it under a device timeout_s of 600), GPU (catalog
# key to predict for; default the device's), ROW_MODELS (PLAN=rows's models, spaces or commas:
# gpt2 bert-large opt-1.3b gpt2-large gpt3-xl, about 15 s a model and dtype on an H100 or H200;
# any of kit/data/shapes.py's MODELS), RESUME_FROM (an earlier
# device_session.tar.gz, carried into the working tree: unpacked first; the collectors resume its
# CSVs and decode_steps skips the rows of its JSONL, so a second run measures only what the first
# did not finish).
#
# PLAN picks the steps (most valuable first; a step is skipped when too little time is left; each
# runs under `timeout` set from the deadline, and the collectors get --time-limit a little under
# it, so they stop cleanly and write their summaries). PLAN=decode (the default; the first
# session, 2026-12-04):
#  1. decode GEMMs (kit/data/shapes.py: decode-linear, decode-bmm) in bf16: the weight GEMMs of
#     a decode step at m = 1..64 (with a bias, NeuSight's form) and attention over 512..16384
#     cached tokens;
#  2. eager decode steps of gpt2, opt-1.3b and llama3-8b (benchmarks/decode_steps.py) beside the
#     kit's prediction; contexts past a model's learned positions are skipped with the reason;
#  3. decode-linear without a bias (Llama's projections) in bf16, and with one in fp16;
#  4. random sweeps of Linear and bmm GEMMs in bf16 and fp32, and vector ops in bf16;
#  5. the last model's decode steps again with HF's dynamic cache.
# PLAN=aligned (the second session): what the first showed the kit lacks on Hopper,
#  1. aligned bf16 Linear GEMMs (--shapes aligned-linear: N and K multiples of 64, as in real
#     models; cuBLAS's nvjet kernels, which the first session's random shapes rarely reached);
#  2. whole-model steps of the 13 bf16 configurations of the first session again
#     (benchmarks/model_steps.py, now with random token ids: the first run's were all zero);
#  3. fused attention, forward and forward+backward, bf16 (benchmarks/attention_sweep.py);
#  4. aligned bf16 bmm (--shapes aligned-bmm), then aligned Linear in fp16, tf32 and fp32.
# PLAN=rows (for a next session): the vector ops of real models at their sizes, in bf16 and fp32
# (--shapes gpt2-layers, bert-large-layers, opt-1.3b-layers: softmax over the attention scores,
# layer norm, GELU, residual adds), where the second session's whole models showed PyTorch's
# warp softmax taking as long in bf16 as in fp32 (its rate set by elements, not bytes) and the
# random sweeps' rows were too small to say at what rate. The kit now bounds softmax by rates read
# off those whole models (kit.predict.element_rates.SOFTMAX_ELEMS_PER_SM_CLOCK); these rows, timed
# on their own, check them: benchmarks/element_rates.py --dir DIR reads DIR/*/rows_*.csv (the
# tarball unpacked into DIR; or gzipped, as committed) beside the vector sweeps.
# The collector flushes the L2 before each timed call and warms each op group for 500 ms (see
# kit/data/collect.py); each CSV gets FILE.meta.json (provenance and settings) and, if anything
# failed, FILE.failed.jsonl.
#
# Output: OUT_DIR/log.txt (everything printed, as it is printed) and OUT_DIR/device_session.tar.gz
# (session/: the CSVs and their .meta.json, the collectors' --json summaries (*.result.json),
# decode_steps*.jsonl/.json, provenance.json, nvidia-smi -q before and after, nvidia-smi samples
# every second, steps.txt: each step's exit status and seconds). The pack runs from an EXIT
# trap, so whatever exists is packed however the script ends (short of SIGKILL); a TERM, INT or
# HUP to the script alone stops the running step at once (step()) and packs. Two files come
# back; the device tool returns at most 8.
set -u
FINAL=${1:-${OUT:-out}}
OUT_DIR=$FINAL/session
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
PY=${PY:-python3}
BUDGET=${BUDGET:-540}
PACK_RESERVE=${PACK_RESERVE:-20}  # seconds kept for the pack at the end
GRACE=10                          # timeout's --kill-after: a step may overrun its limit by this
MIN_STEP=${MIN_STEP:-25}          # skip a step with less time than this left
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET - PACK_RESERVE - GRACE))
mkdir -p "$OUT_DIR"
LOG=$FINAL/log.txt
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export KIT_CACHE=${KIT_CACHE:-/tmp/kit-cache}
SMI_PID=

packed=
pack() {  # whatever exists under session/ into one tarball; runs once, from the EXIT trap
  [ -n "$packed" ] && return
  packed=1
  trap '' TERM INT HUP
  [ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 15 nvidia-smi -q > "$OUT_DIR/nvidia-smi-after.txt" 2>&1
  fi
  echo "device_session: finished $(date -u +%FT%TZ), $(( $(date +%s) - T0 )) s"
  ls -l "$OUT_DIR"
  cp "$LOG" "$OUT_DIR/log.txt" 2>/dev/null
  if tar -czf "$FINAL/device_session.tar.gz.part" -C "$FINAL" session; then
    mv -f "$FINAL/device_session.tar.gz.part" "$FINAL/device_session.tar.gz" && rm -rf "$OUT_DIR"
    echo "device_session: packed into $FINAL/device_session.tar.gz ($(du -k "$FINAL/device_session.tar.gz" | cut -f1) KiB)"
  else
    echo "device_session: tar failed; the files stay in $OUT_DIR"
  fi
}
finish() {
  pack
  exec 1>&- 2>&-        # let tee see the end of its input, then wait for it to write the log
  wait "$TEE_PID" 2>/dev/null || sleep 1
}
STEP_PID=
step() {  # OUTFILE command...: run a step in the background and wait for it. bash runs a trap only
  # once the foreground command ends: a TERM to this script had waited for the step's own timeout
  # (56 s of a 60 s step; the model steps' is 200 s) before packing, past any grace before a KILL.
  # `wait` returns at the signal; the trap then stops the step (its timeout passes the TERM on).
  # OUTFILE - keeps stdout (the log). <&0: a background command's stdin is otherwise /dev/null,
  # and the provenance step reads its script from a here-document
  local out=$1 rc
  shift
  if [ "$out" = - ]; then "$@" <&0 & else "$@" > "$out" <&0 & fi
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  return $rc
}
stop_step() {  # TERM to the running step: the collectors record the interruption and stop
  [ -n "$STEP_PID" ] || return 0
  kill -TERM "$STEP_PID" 2>/dev/null
  wait "$STEP_PID" 2>/dev/null  # timeout's --kill-after bounds it
  STEP_PID=
}
trap finish EXIT
trap 'echo "device_session: signal received, stopping the step"; stop_step; exit 143' TERM INT HUP

PLAN=${PLAN:-decode}
case "$PLAN" in decode|aligned|rows) ;; *) echo "device_session: PLAN must be decode, aligned or rows, not $PLAN"; exit 2;; esac
if [ -n "$QUICK" ]; then
  ROW_MODELS=${ROW_MODELS:-gpt2}
  ALINEAR=tiny-gemm:4:5 ABMM=tiny-gemm:4:6 ATT_COUNT=2 ATT_MAX_SEQ=128
  MODEL_CONFIGS=gpt2:fp32:1:32
  LINEAR=tiny-gemm:4 BMM=tiny-gemm:4 RLINEAR=tiny-gemm:4:1 RBMM=tiny-gemm:4:2 RFP32=tiny-gemm:4:3
  VEC=tiny-vec:4 REPEATS=3
  MODELS=${MODELS:-gpt2} BATCHES=1 CONTEXTS=16,2000
else
  ALINEAR=aligned-linear:700:31 ABMM=aligned-bmm:400:32 ATT_COUNT=120 ATT_MAX_SEQ=8192
  MODEL_CONFIGS=gpt2:bf16:8:1024,bert-large:bf16:16:512,opt-1.3b:bf16:8:2048,llama3-8b:bf16:1:2048,gpt3-2.7b:bf16:4:2048,llama3-8b:bf16:4:2048,gpt2-xl:bf16:8:1024,gpt3-xl:bf16:4:2048,gpt2-large:bf16:8:1024,opt-1.3b:bf16:2:2048,gpt3-6.7b:bf16:1:2048,qwen3-8b:bf16:2:2048,bert-base:bf16:64:512
  LINEAR=decode-linear BMM=decode-bmm RLINEAR=random-linear:150:1 RBMM=random-bmm:150:2
  RFP32=random-linear:150:3 VEC=random-vec:60 REPEATS=25
  MODELS=${MODELS:-gpt2,opt-1.3b,llama3-8b} BATCHES=1,8,32 CONTEXTS=512,2000,4096
fi

echo "device_session: $(date -u +%FT%TZ) device=$DEVICE quick=${QUICK:-no} budget=${BUDGET}s host=$(hostname)"
if [ -n "${RESUME_FROM:-}" ]; then
  if [ -f "$RESUME_FROM" ] && tar -xzf "$RESUME_FROM" -C "$FINAL" session; then
    echo "device_session: resumed from $RESUME_FROM: $(ls "$OUT_DIR" | wc -l) files"
    rm -f "$OUT_DIR/log.txt"  # the earlier log is in the earlier tarball
  else
    echo "device_session: RESUME_FROM=$RESUME_FROM is not a readable tarball with session/; starting afresh"
  fi
fi

# ---- provenance -----------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi -q > "$OUT_DIR/nvidia-smi-before.txt" 2>&1
  FIELDS=timestamp,pstate,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used
  for r in clocks_event_reasons.active clocks_throttle_reasons.active; do
    if timeout 10 nvidia-smi --query-gpu=$FIELDS,$r --format=csv,noheader >/dev/null 2>&1; then
      FIELDS=$FIELDS,$r; break
    fi
  done
  nvidia-smi --query-gpu=$FIELDS --format=csv -lms 1000 > "$OUT_DIR/nvidia-smi-samples.csv" 2>&1 &
  SMI_PID=$!
fi
# a step too: importing torch on a cold machine takes seconds, and a TERM had waited for it (up to 60 s)
step - timeout --kill-after=$GRACE 60 "$PY" - "$OUT_DIR/provenance.json" "$DEVICE" <<'EOF' || echo "device_session: provenance failed ($?)"
import json, platform, socket, subprocess, sys, time
import torch
out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
       "platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
       "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    out.update(device=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
               sms=p.multi_processor_count, memory_bytes=p.total_memory,
               l2_bytes=getattr(p, "L2_cache_size", None),
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
               nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
try:
    q = "name,driver_version,vbios_version,clocks.max.sm,clocks.max.mem,power.limit,power.max_limit"
    out["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"],
                                       capture_output=True, text=True, timeout=15).stdout.strip()
except (OSError, subprocess.SubprocessError) as e:
    out["nvidia_smi"] = f"unavailable: {e}"
for mod in ("numpy", "pandas", "triton", "fbgemm_gpu", "transformers"):
    try:
        out[mod] = __import__(mod).__version__
    except Exception:
        out[mod] = None
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("provenance:", json.dumps({k: out.get(k) for k in ("torch", "torch_cuda", "device", "l2_bytes")}))
EOF
echo "device_session: provenance done at $(( $(date +%s) - T0 )) s"

# ---- steps ----------------------------------------------------------------------------------
STEP_LIMIT=0
step_limit() {  # cap -> STEP_LIMIT (seconds; 0: skip the step)
  local left=$(( DEADLINE - $(date +%s) )) cap=$1
  if [ "$left" -lt "$MIN_STEP" ]; then STEP_LIMIT=0; else STEP_LIMIT=$(( cap < left ? cap : left )); fi
}
note() {  # name rc seconds limit
  echo "$1 rc=$2 ${3}s limit=${4}s" >> "$OUT_DIR/steps.txt"
  echo "device_session: step $1 rc=$2 in ${3}s (limit ${4}s); $(( DEADLINE - $(date +%s) ))s left"
}
collect() {  # name cap ops shapes dtype [extra collect flags...]
  local name=$1 cap=$2 ops=$3 shapes=$4 dtype=$5
  shift 5
  step_limit "$cap"
  if [ "$STEP_LIMIT" = 0 ]; then note "$name" skipped 0 0; return; fi
  local t=$(date +%s) tl=$(( STEP_LIMIT > 40 ? STEP_LIMIT - 20 : STEP_LIMIT / 2 ))
  step "$OUT_DIR/$name.result.json" timeout --kill-after=$GRACE "$STEP_LIMIT" \
      "$PY" -m kit collect --device "$DEVICE" --ops "$ops" \
      --shapes "$shapes" --dtype "$dtype" --repeats "$REPEATS" --warmup-ms 500 --time-limit "$tl" \
      --out "$OUT_DIR/$name.csv" --resume --json "$@"
  local rc=$?
  note "$name" $rc $(( $(date +%s) - t )) "$STEP_LIMIT"
  "$PY" -c 'import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print("  %s: %s measured, %s already there, %s failed, stopped: %s" % (
        sys.argv[2], r["measured"], r["skipped"], len(r["failed"]), r.get("stopped")))
except Exception as e:
    print("  %s: no summary (%s)" % (sys.argv[2], e))' "$OUT_DIR/$name.result.json" "$name"
}
decode() {  # name cap models kv-cache
  local name=$1 cap=$2 models=$3 kind=$4
  step_limit "$cap"
  if [ "$STEP_LIMIT" = 0 ]; then note "$name" skipped 0 0; return; fi
  local t=$(date +%s) tl=$(( STEP_LIMIT > 40 ? STEP_LIMIT - 25 : STEP_LIMIT / 2 ))
  step "$OUT_DIR/$name.json" timeout --kill-after=$GRACE "$STEP_LIMIT" \
      "$PY" benchmarks/decode_steps.py --device "$DEVICE" \
      --models "$models" --batches "$BATCHES" --contexts "$CONTEXTS" --dtype bf16 \
      --repeats "$REPEATS" --kv-cache "$kind" ${GPU:+--gpu "$GPU"} --time-limit "$tl" \
      --jsonl "$OUT_DIR/$name.jsonl"
  note "$name" $? $(( $(date +%s) - t )) "$STEP_LIMIT"
}

attention() {  # name cap dtype
  local name=$1 cap=$2 dtype=$3
  step_limit "$cap"
  if [ "$STEP_LIMIT" = 0 ]; then note "$name" skipped 0 0; return; fi
  local t=$(date +%s) tl=$(( STEP_LIMIT > 40 ? STEP_LIMIT - 20 : STEP_LIMIT / 2 ))
  step "$OUT_DIR/$name.json" timeout --kill-after=$GRACE "$STEP_LIMIT" \
      "$PY" benchmarks/attention_sweep.py --device "$DEVICE" \
      --dtype "$dtype" --count "$ATT_COUNT" --seed 1 --max-seq "$ATT_MAX_SEQ" --repeats "$REPEATS" \
      --time-limit "$tl" --jsonl "$OUT_DIR/$name.jsonl"
  note "$name" $? $(( $(date +%s) - t )) "$STEP_LIMIT"
}
models() {  # name cap configs
  local name=$1 cap=$2 configs=$3
  step_limit "$cap"
  if [ "$STEP_LIMIT" = 0 ]; then note "$name" skipped 0 0; return; fi
  local t=$(date +%s) tl=$(( STEP_LIMIT > 40 ? STEP_LIMIT - 30 : STEP_LIMIT / 2 ))
  step "$OUT_DIR/$name.json" timeout --kill-after=$GRACE "$STEP_LIMIT" \
      "$PY" benchmarks/model_steps.py --device "$DEVICE" \
      --configs "$configs" --no-predict --repeats 10 --time-limit "$tl" \
      --jsonl "$OUT_DIR/$name.jsonl"
  note "$name" $? $(( $(date +%s) - t )) "$STEP_LIMIT"
}

if [ "$PLAN" = rows ]; then
  ROW_MODELS=${ROW_MODELS:-gpt2 bert-large opt-1.3b gpt2-large gpt3-xl}
  for m in ${ROW_MODELS//,/ }; do
    collect "rows_${m}_bf16" 60 "elementwise,softmax,layernorm" "${m}-layers" bf16
    collect "rows_${m}_fp32" 60 "elementwise,softmax,layernorm" "${m}-layers" fp32
  done
  echo "device_session: steps done in $(( $(date +%s) - T0 )) s"
  exit 0
fi
if [ "$PLAN" = aligned ]; then
  collect aligned_linear_bf16 60 linear "$ALINEAR" bf16
  models model_steps_bf16 200 "$MODEL_CONFIGS"
  attention attention_bf16 75 bf16
  collect aligned_bmm_bf16 45 bmm "$ABMM" bf16
  collect aligned_linear_fp16 35 linear "$ALINEAR" fp16
  collect aligned_linear_tf32 35 linear "$ALINEAR" tf32
  collect aligned_linear_fp32 35 linear "$ALINEAR" fp32
  echo "device_session: steps done in $(( $(date +%s) - T0 )) s"
  exit 0
fi
collect decode_linear_bf16 60 linear "$LINEAR" bf16
collect decode_bmm_bf16 45 bmm "$BMM" bf16
decode decode_steps 150 "$MODELS" static
collect decode_linear_nobias_bf16 50 linear "$LINEAR" bf16 --no-bias
collect decode_linear_fp16 50 linear "$LINEAR" fp16
collect random_linear_bf16 50 linear "$RLINEAR" bf16
collect random_bmm_bf16 45 bmm "$RBMM" bf16
collect random_linear_fp32 50 linear "$RFP32" fp32
collect vector_bf16 45 "elementwise,softmax,layernorm" "$VEC" bf16
decode decode_steps_dynamic 60 "${MODELS##*,}" dynamic
echo "device_session: steps done in $(( $(date +%s) - T0 )) s"
