#!/usr/bin/env bash
# The scenario panel: one `reshard_plan --topology` run per scenario (every
# rank planned and priced in one process, no GPU needed), printed as one
# markdown table beside the published figures. Rerunnable: after planner
# changes (relays), run it again and paste the table into
# docs/PERFORMANCE.md.
#
#   scripts/panel.sh [BUILD_DIR]        (default: build)
#
# Extra reshard_plan options (e.g. --relay 1) can be passed through
# PANEL_ARGS. Each run's full output is kept in $PANEL_LOGS (default
# /tmp/reshard_panel); how long each took goes to stderr.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
plan=$build/tools/reshard_plan
logs=${PANEL_LOGS:-/tmp/reshard_panel}
extra=${PANEL_ARGS:-}
[[ -x $plan ]] || { echo "panel.sh: $plan not built (cmake --build $build --target reshard_plan)" >&2; exit 2; }
mkdir -p "$logs"

# name | config | train | infer | topology | published [| reshard_plan options]
# (the fp8 rows quantize on the way, --infer-dtype fp8e4m3: their vLLM side
# uses EP, since block scales need every split on whole 128 x 128 blocks,
# which DeepSeek-V3's experts split over 128 ranks are not)
# (Megatron-core needs pp to divide the layers unless the first/last
# stage's count is given: DeepSeek-V3's and Kimi-K2's 61 layers, Qwen3's
# 94; expert TP defaults to tp, so etp=1 where tp x dp / ep is smaller)
scenarios=(
  "DeepSeek-V3 671B|DeepSeek-V3.json|tp=1,pp=4,dp=32,ep=16,first=16|tp=8,dp=16|gb200-nvl72|NCCL M2N 1.45 s hierarchical, 3.84 s direct"
  "Qwen3-235B-A22B|Qwen3-235B-A22B.json|tp=2,pp=4,dp=8,ep=16,etp=1,first=23,last=23|tp=8,dp=8|gb200-nvl72|NCCL M2N 0.99 s"
  "Kimi-K2 1T|Kimi-K2-Instruct.json|tp=2,pp=8,dp=16,ep=32,etp=1,first=5|tp=8,dp=16,ep=128|h100-8x400g|Perplexity 1.3 s (RDMA)"
  "Llama-3.1-70B|Llama-3.1-70B.json|tp=8,pp=4|tp=8,dp=8|h100-8x400g|"
  "Qwen3-30B-A3B|Qwen3-30B-A3B.json|tp=1,pp=2,dp=16,ep=16|tp=4,dp=8,ep=32|h100-8x400g|"
  "DeepSeek-V3 671B, bf16 -> fp8 blocks|DeepSeek-V3.json|tp=1,pp=4,dp=32,ep=16,first=16|tp=8,dp=16,ep=128|gb200-nvl72||--infer-dtype fp8e4m3"
  "Kimi-K2 1T, bf16 -> fp8 blocks|Kimi-K2-Instruct.json|tp=2,pp=8,dp=16,ep=32,etp=1,first=5|tp=8,dp=16,ep=128|h100-8x400g|Perplexity 1.3 s (fp8, RDMA)|--infer-dtype fp8e4m3"
  # NCCL M2N's own configurations, beside its published figures: its
  # paper's DeepSeek-V3 trainer TP1/PP8/EP16 -> generator TP16/DP8 (vLLM
  # TP16 spans two 8-GPU H100 nodes), and its README's Qwen3-235B
  # TP2/CP2/PP4/EP16 -> TP8/DP8 (cp: Megatron's context parallelism). The
  # trainer's DP is not in those summaries: the trainer here has as many
  # ranks as the generator (dp=16, dp=4). first=5 / first=23,last=23: the
  # stages Megatron-core can build of 61 / 94 layers.
  "DeepSeek-V3 671B, M2N's configuration|DeepSeek-V3.json|tp=1,pp=8,dp=16,ep=16,first=5|tp=16,dp=8|h100-8x400g|NCCL M2N 2.77 s end to end (paper)"
  "Qwen3-235B-A22B, M2N's configuration (CP2)|Qwen3-235B-A22B.json|tp=2,cp=2,pp=4,dp=4,ep=16,etp=1,first=23,last=23|tp=8,dp=8|gb200-nvl72|NCCL M2N 0.99 s (README)"
  # SGLang (issue 45): DeepSeek-V3 served with DP attention and EP inside
  # one 16-GPU engine (two H100 nodes), and Qwen3-235B on 8 engines of
  # EP8 (sglang:SPEC, src/models/sglang.c)
  "DeepSeek-V3 671B -> SGLang DP attention|DeepSeek-V3.json|tp=1,pp=4,dp=32,ep=16,first=16|sglang:tp=16,attn_dp=16,ep=16|h100-8x400g|"
  "Qwen3-235B-A22B -> SGLang EP8 x 8 engines|Qwen3-235B-A22B.json|tp=2,pp=4,dp=8,ep=16,etp=1,first=23,last=23|sglang:tp=8,dp=8,ep=8|gb200-nvl72|"
)

field() { sed -nE "s/.*$1=([^ ]+).*/\1/p"; }

echo "| scenario | GPUs (train + infer) | topology | T_lower s (bound) | source-domain cut s (x T_lower) | ours s | ours / T_lower | gather-broadcast s (ratio) | replica0-direct s (ratio) | balanced-direct s (ratio) | published |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
start_all=$SECONDS
for s in "${scenarios[@]}"; do
  IFS='|' read -r name cfg train infer topo pub args <<<"$s"
  log=$logs/$(echo "$name" | tr -c 'A-Za-z0-9.\n-' '_').txt
  start=$SECONDS
  # shellcheck disable=SC2086
  ok=1
  "$plan" --model-config "$repo/configs/$cfg" --train "$train" --infer "$infer" --topology "$topo" --no-check \
    $extra ${args:-} >"$log" 2>&1 || ok=0
  echo "panel.sh: $name: $((SECONDS - start)) s" >&2
  if [[ $ok == 0 ]]; then
    echo "panel.sh: $name failed, see $log" >&2
    echo "| $name | | $topo | failed | | | | | | | $pub |"
    continue
  fi
  world=$(sed -nE 's/^# world ([0-9]+) \(([0-9]+) source, ([0-9]+) destination.*/\2 + \3/p' "$log")
  res=$(grep '^# reshard_plan: predicted_s=' "$log")
  ours=$(field predicted_s <<<"$res")
  lower=$(field lower_s <<<"$res")
  ratio=$(field ratio <<<"$res")
  bound=$(sed -nE 's/^# T_lower: [^,]+, bound by ([a-z-]+).*/\1/p' "$log")
  # a bound T_lower leaves out (tools/cost_report.c): what one source
  # domain alone holds must leave through its own NICs
  cut=$(sed -nE 's/^# source-domain cut \(not in T_lower\): ([^ ]+) s = ([^ ]+) x T_lower.*/\1 (\2)/p' "$log")
  cells=""
  for b in gather-broadcast replica0-direct balanced-direct; do
    line=$(grep "^# baseline $b: predicted_s=" "$log")
    cells="$cells | $(field predicted_s <<<"$line") ($(field ratio <<<"$line"))"
  done
  echo "| $name: megatron $train -> vllm $infer | $world | $topo | $lower ($bound) | ${cut:--} | $ours | $ratio$cells | $pub |"
done
echo "panel.sh: all scenarios: $((SECONDS - start_all)) s" >&2
