#!/usr/bin/env bash
# Re-render the example batch scripts in slurm/ and the Ray plans in ray/ from their recipes
# (tests/ops/test_recipes.py fails when they are stale). Usage: slurm/render.sh
set -euo pipefail
cd "$(dirname "$0")/.."
UCCL_EP=${UCCL_EP:-.venv/bin/uccl-ep}
SLURM_EXAMPLES=(local/bench-cpu bench/p5en bench/mi300x-thor2 sglang/deepseek-v3-p5en vllm/deepseek-v3-p5en
                megatron/deepseek-v3-p5en sglang/qwen3-235b-p6-b200 vllm/qwen3-235b-mi300x-cx7
                megatron/qwen3-235b-mi300x-thor2 primus/deepseek-v3-mi300x-thor2 sglang/tiny-moe-p5en)
RAY_EXAMPLES=(local/bench-cpu bench/p5en vllm/deepseek-v3-p5en megatron/tiny-moe-mi300x-cx7)
rm -f slurm/*.sbatch ray/*.plan.json
for r in "${SLURM_EXAMPLES[@]}"; do
  name=$("$UCCL_EP" launch show "$r" --plan | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
  "$UCCL_EP" launch slurm "$r" --dry-run >"slurm/$name.sbatch"
done
for r in "${RAY_EXAMPLES[@]}"; do
  name=$("$UCCL_EP" launch show "$r" --plan | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
  "$UCCL_EP" launch show "$r" --plan >"ray/$name.plan.json"
done
echo "rendered $(ls slurm/*.sbatch | wc -l) batch scripts, $(ls ray/*.plan.json | wc -l) Ray plans"
