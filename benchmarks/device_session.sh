#!/usr/bin/env bash
# One prepared run for a session that is lent a GPU: measure what no reference dataset has, with
# the kit's own collector, in well under ten minutes, into OUT_DIR (the device tool's $OUT).
#
#   bash benchmarks/device_session.sh [OUT_DIR]          # on the GPU machine (python3 has torch)
#   DEVICE=cpu QUICK=1 bash benchmarks/device_session.sh /tmp/out   # a dry run anywhere
#
# 1. decode GEMMs (kit/data/shapes.py: decode-linear, decode-bmm) in bf16 and fp16: the weight
#    GEMMs of a decode step at m = 1..64 and attention over 512..16384 cached tokens
#    (NeuSight's data has ~35 GEMMs a GPU with m <= 16, all FP32);
# 2. a random sweep of Linear and bmm GEMMs in bf16 and fp32, and vector ops in bf16;
# 3. eager decode steps of gpt2, opt-1.3b and llama3-8b (benchmarks/decode_steps.py), measured
#    beside the kit's prediction for this GPU, and the last model again with HF's dynamic cache.
# Each CSV carries its provenance (device name, torch and CUDA versions) in its rows; the
# collector resumes a CSV it finds, so a second run after a timeout carries on. The device tool
# returns at most 8 files: everything lands in OUT_DIR/session/, packed at the end into
# OUT_DIR/device_session.tar.gz beside provenance.txt and decode_steps.json.
set -u
FINAL=${1:-${OUT:-out}}
OUT_DIR=$FINAL/session
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export KIT_CACHE=${KIT_CACHE:-/tmp/kit-cache}
PY=${PY:-python3}
if [ -n "$QUICK" ]; then
  LINEAR=tiny-gemm:4 BMM=tiny-gemm:4 RLINEAR=tiny-gemm:4:1 RBMM=tiny-gemm:4:2 RFP32=tiny-gemm:4:3
  VEC=tiny-vec:4 REPEATS=3
  MODELS=${MODELS:-gpt2} BATCHES=1 CONTEXTS=16
else
  LINEAR=decode-linear BMM=decode-bmm RLINEAR=random-linear:150:1 RBMM=random-bmm:150:2
  RFP32=random-linear:150:3 VEC=random-vec:60 REPEATS=25
  MODELS=${MODELS:-gpt2,opt-1.3b,llama3-8b} BATCHES=1,8,32 CONTEXTS=512,4096
fi
start=$(date +%s)
{
  echo "device_session: $(date -u +%FT%TZ) device=$DEVICE quick=${QUICK:-no}"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
          torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
} | tee "$OUT_DIR/provenance.txt"

collect() {  # name ops shapes dtype
  $PY -m kit collect --device "$DEVICE" --ops "$2" --shapes "$3" --dtype "$4" \
      --repeats "$REPEATS" --out "$OUT_DIR/$1.csv" --resume || echo "collect $1 failed ($?)"
}
collect decode_linear_bf16 linear "$LINEAR" bf16
collect decode_bmm_bf16 bmm "$BMM" bf16
collect decode_linear_fp16 linear "$LINEAR" fp16
collect random_linear_bf16 linear "$RLINEAR" bf16
collect random_bmm_bf16 bmm "$RBMM" bf16
collect random_linear_fp32 linear "$RFP32" fp32
collect vector_bf16 "elementwise,softmax,layernorm" "$VEC" bf16
$PY benchmarks/decode_steps.py --device "$DEVICE" --models "$MODELS" --batches "$BATCHES" \
    --contexts "$CONTEXTS" --dtype bf16 --repeats "$REPEATS" ${GPU:+--gpu "$GPU"} \
    > "$OUT_DIR/decode_steps.json" || echo "decode_steps failed ($?)"
$PY benchmarks/decode_steps.py --device "$DEVICE" --models "${MODELS##*,}" --batches "$BATCHES" \
    --contexts "$CONTEXTS" --dtype bf16 --repeats "$REPEATS" --kv-cache dynamic ${GPU:+--gpu "$GPU"} \
    > "$OUT_DIR/decode_steps_dynamic.json" || echo "decode_steps (dynamic cache) failed ($?)"
echo "device_session: done in $(( $(date +%s) - start )) s" | tee -a "$OUT_DIR/provenance.txt"
ls -l "$OUT_DIR"
cp "$OUT_DIR/provenance.txt" "$OUT_DIR/decode_steps.json" "$FINAL/" 2>/dev/null
tar -czf "$FINAL/device_session.tar.gz" -C "$FINAL" session && rm -rf "$OUT_DIR"
