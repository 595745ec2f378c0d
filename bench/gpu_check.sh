#!/usr/bin/env bash
# On a CUDA machine, within 10 minutes: the Triton kernel tests compiled (no interpreter, bf16 included),
# then the attention benchmark table. Everything goes to a record, results/<date>_gpu_check_<gpu name>/README.md.
#   bash bench/gpu_check.sh            (PYTHON=... to pick the interpreter; default python3)
# Time plan: tests <= 3 min, attention benchmark <= 4 min (it starts no new group after 3.3), end-to-end
# training <= 1.5 min, generation (prefill and decode, dense / local / routed 10%) <= 1.5 min.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
unset TRITON_INTERPRET  # the point is to run the kernels compiled

if ! gpu=$($PY -c "import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name())" 2>/dev/null); then
    echo "bench/gpu_check.sh needs a CUDA GPU visible to $PY" >&2
    exit 1
fi
record="results/$(date +%F)_gpu_check_$(echo "$gpu" | tr -c 'A-Za-z0-9._\n-' '_')"
mkdir -p "$record"
report="$record/README.md"
table=$(mktemp)
status=0

{
    echo "# GPU check, $(date '+%F %T'), $gpu"
    echo
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    $PY -c "import torch, triton; print(f'torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}')"
    echo
    echo "## Kernel tests (compiled)"
    echo
    echo '```'
} >"$report"
timeout 180 $PY -m pytest -q -rs tests/e2e/test_triton_attention.py tests/e2e/test_triton_compile.py 2>&1 | tail -n 40 | tee -a "$report" || status=1
echo '```' >>"$report"

echo >>"$report"
timeout 240 $PY bench/attention.py --budget_s 200 --out "$table" || status=1
cat "$table" >>"$report"
rm -f "$table"

{
    echo
    echo "## End to end: 12 layers, 768 wide, T=8192, w=256 (bench/train_speed.py)"
    echo
} >>"$report"
timeout 90 $PY bench/train_speed.py --steps 5 2>&1 | tee -a "$report" || status=1

{
    echo
    echo "## Generation: 12 layers, 768 wide, window 256, 8K context (bench/generate.py)"
    echo
} >>"$report"
timeout 90 $PY bench/generate.py --device cuda --n_layer 12 --n_head 12 --n_embd 768 --window 256 \
    --contexts 8192 --batches 1 8 --new_tokens 64 --repeats 2 2>&1 | tee -a "$report" || status=1

echo "wrote $report"
exit $status
