#!/usr/bin/env bash
# Every GPU figure docs/benchmarks.md is missing, in parts that each fit one
# 10-minute call of a lent GPU machine (compiles included; the part's figures
# come back even where its time runs out, PART_SECONDS, default 540):
#
#   bash benchmarks/gpu.sh ab       # the step A/B: txf vs the PyTorch recipe, same steps,  (~8 min)
#                                   # XLA's Triton GEMMs off, fused loss, vocabulary 512,
#                                   # 1 layer; kernel time by category for each
#   bash benchmarks/gpu.sh loop     # the real loop's variants vs the step, a profile    (~7 min)
#   bash benchmarks/gpu.sh long     # gpt2_small at 8k, 16k, 32k, 64k context            (~9 min)
#                                   # (LONG_LENGTHS="32768 65536" runs some of them)
#   bash benchmarks/gpu.sh decode   # decoding vs transformers; seed replicas            (~8 min)
#                                   # (DECODE_BASE=DIR also times batch 1 of the txf in DIR)
#   bash benchmarks/gpu.sh sweep    # configs/sweeps/pe_ln_gpu.py, 6 points at a time   (~10 min)
#                                   # (SWEEP_CONFIG=configs/sweeps/t5_distance.py:gpu another)
#   bash benchmarks/gpu.sh loss     # the loss alone: XLA's passes vs the Pallas kernel's    (~2 min)
#                                   # block sizes and warps (benchmarks/loss_kernel.py)
#   bash benchmarks/gpu.sh change   # a change's A/B: the step before (txf in $BASE) and after,  (~9 min)
#                                   # the PyTorch recipe beside the after; both again with cuBLAS GEMMs
#   bash benchmarks/gpu.sh all      # ab, loop, long, decode in turn, where no time limit applies
#
# `change` needs the txf before the change beside the working tree, with the
# benchmarks of the same commit (they call that txf's API), made here (and
# carried along, it is git-ignored):
#   rm -rf .ab_base && mkdir .ab_base && git archive REF txf configs benchmarks | tar -x -C .ab_base
#
# Each benchmark's limit allows a cold compile: gpt2_small's step took about
# 100 s to compile on the H200 machine of 2026-11-28 (GPU idle meanwhile),
# about 40 s on the H100 machine of 2026-11-27.
#
# Run from the repository root. Packages the machine lacks come from .whl/
# (benchmarks/fetch_wheels.sh, run beforehand where PyPI is reachable). Each
# part writes $OUT/<part>.tar.gz (JSON reports, logs, an nvidia-smi sample of
# clocks, power, temperature and throttle reasons every 0.5 s, profiles) and
# prints a summary (benchmarks/summarize.py) last. EXTRA="--config.model.d_model=32 ..."
# appends flags to every step, loop, decode and replicas call (a smoke test on a CPU at toy size).
#
# A benchmark that fails or runs out of time prints 'FAILED: NAME (exit N)';
# the part still runs the rest and archives what exists, then exits 1.
# No `set -e`: one failure must not cost the part's other figures.
set -uo pipefail
part=${1:?usage: bash benchmarks/gpu.sh ab|loss|change|loop|long|decode|sweep|all}
OUT=${OUT:-gpu_results}
deadline=$(( $(date +%s) + ${PART_SECONDS:-540} ))
if [ "$part" = all ]; then
  status=0
  for p in ab loop long decode; do bash "$0" "$p" || status=1; done
  exit $status
fi
dir=$PWD/gpu_results/$part
# A sweep resumes the points an earlier call carried back; every other part starts afresh.
[ "$part" = sweep ] || rm -rf "$dir"
mkdir -p "$dir" "$OUT"
failures=0
failed() {  # failed WHAT STATUS: a loud line, and the part's exit status becomes 1
  echo "FAILED: $1 (exit $2$([ "$2" = 124 ] && echo ', timed out'))" | tee -a "$dir/log.txt"
  failures=$(( failures + 1 ))
}
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The persistent compilation cache survives between calls while the machine stays warm.
export JAX_COMPILATION_CACHE_DIR=$PWD/.jax_cache
# A device that hangs at startup must not hold the whole call.
timeout 120 python3 -c "import jax, flax, optax, orbax.checkpoint, sys; print(sys.version.split()[0], \
  'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" \
  2>&1 | tee "$dir/versions.txt"
status=${PIPESTATUS[0]}
[ "$status" = 0 ] || failed versions "$status"
timeout 60 nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv \
  >> "$dir/versions.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,\
utilization.gpu,memory.used,clocks_throttle_reasons.active --format=csv -lms 500 \
  > "$dir/nvidia_smi.csv" 2>&1 &
smi=$!
trap 'kill "$smi" 2>/dev/null' EXIT  # every exit, an early one included

bench() {  # bench NAME SECONDS MODE ARGS...: one benchmark, its report in $dir/NAME.json,
  # stopped at SECONDS or at the part's deadline, whichever comes first
  local name=$1 limit=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -gt 10 ] || { echo "== $name: skipped (the part's time is up)" | tee -a "$dir/log.txt"; return; }
  echo "== $name ($(date +%s), ${limit} s at most, XLA_FLAGS='${XLA_FLAGS:-}'): $*" | tee -a "$dir/log.txt"
  timeout "$limit" python3 -m benchmarks.run "$@" ${EXTRA:-} --json="$dir/$name.json" 2>&1 \
    | grep -v -e "Unable to initialize backend" -e "^W0000" -e "^I1" | tee -a "$dir/log.txt"
  local status=${PIPESTATUS[0]}  # the benchmark's (grep's is 1 when it filters every line)
  [ "$status" = 0 ] || failed "$name" "$status"
  return "$status"  # a call in a subshell (cd "$base" && bench ...) counts through it
}
GPT2=--config=configs/gpt2_small.py
case $part in
  ab)
    # The same step count and windows for txf and PyTorch; 5 more steps of each
    # profiled (kernel time by category); the compiled program's text kept.
    AB="--steps=${AB_STEPS:-150} --window=${AB_WINDOW:-50} --fresh_batches --nosync --profile_steps=5"
    # The autotuner's choices, for deviceless compiles to load (--xla_gpu_load_autotune_results_from).
    XLA_FLAGS="--xla_gpu_dump_autotune_results_to=$dir/autotune_step_base.textproto" \
      bench step_base 230 step $GPT2 $AB --torch --compiled_text="$dir/step_base.hlo.txt"
    XLA_FLAGS="--xla_gpu_enable_triton_gemm=false" bench step_no_triton_gemm 100 step $GPT2 $AB \
      --compiled_text="$dir/step_no_triton_gemm.hlo.txt"
    bench step_fused_loss 100 step $GPT2 $AB --config.train.loss_chunk_len=256
    bench step_vocab512 130 step $GPT2 $AB --config.model.vocab_size=512 --torch
    bench step_1layer 100 step $GPT2 $AB --config.model.num_layers=1 --torch
    ;;
  loss)
    bench loss_kernel 240 loss_kernel $GPT2
    ;;
  change)
    # The step before the change (txf in $BASE) and after it, the PyTorch
    # recipe in the same call (its ratio for the step after), the step after
    # with cuBLAS GEMMs; the autotuner's choices and the compiled text kept.
    base=${BASE:-.ab_base}
    [ -d "$base/txf" ] || { echo "no $base/txf: make it first (see the top of this file)"; exit 2; }
    STEPS="--steps=${AB_STEPS:-150} --window=50 --fresh_batches --nosync --profile_steps=5"
    (cd "$base" && bench step_before 200 step $GPT2 $STEPS) || failures=$(( failures + 1 ))
    XLA_FLAGS="--xla_gpu_dump_autotune_results_to=$dir/autotune_step_after.textproto" \
      bench step_after 300 step $GPT2 $STEPS --torch --compiled_text="$dir/step_after.hlo.txt"
    XLA_FLAGS="--xla_gpu_enable_triton_gemm=false" bench step_after_no_triton_gemm 100 step \
      $GPT2 $STEPS --compiled_text="$dir/step_after_no_triton_gemm.hlo.txt"
    # cuBLAS GEMMs take bias and GELU epilogues that XLA's Triton GEMM fusions
    # do not: a change may move bytes between the two programs.
    (cd "$base" && XLA_FLAGS="--xla_gpu_enable_triton_gemm=false" \
      bench step_before_no_triton_gemm 100 step $GPT2 $STEPS) || failures=$(( failures + 1 ))
    ;;
  loop)
    # LOOP_STEPS and LOOP_VARIANTS (benchmarks/loop.py's names) size it to the call's time.
    # The trace covers the 5 steps right after the first evaluation and checkpoint,
    # where `full` lost 2.3 s on 2026-11-27 (docs/benchmarks.md, the real loop).
    steps=${LOOP_STEPS:-400}
    bench loop 440 loop $GPT2 --steps=$steps --window=50 --config.eval.every=$(( steps / 2 )) \
      --config.train.checkpoint_every=$(( steps / 2 )) --profile_dir="$dir/profile" \
      --profile_steps=$(( steps / 2 + 1 )),$(( steps / 2 + 5 )) \
      --loop_variants=${LOOP_VARIANTS:-full,checkpoint_only,no_eval,random_ids,no_prefetch,log_every_step,host_only}
    bench step_b32_reused_batch 110 step $GPT2 --steps=200 --window=50  # as the issue's 430k
    # A step dispatched during a save of gpt2_small's 1.49 GB state in its 591 arrays.
    EXTRA= bench checkpoint_stall 90 checkpoint_stall --leaves=591  # no config: EXTRA's flags are not its
    ;;
  long)
    for len in ${LONG_LENGTHS:-8192 16384 32768 65536}; do
      batch=$(( 32768 / len > 0 ? 32768 / len : 1 ))
      bench "step_${len}" 160 step --config=configs/gpt2_small_8k.py --steps=30 --window=10 \
        --fresh_batches --nosync --config.model.max_len=$len --config.data.seq_len=$len \
        --config.data.batch_size=$batch --config.eval.num_batches=1
    done
    ;;
  decode)
    bench decode 200 decode $GPT2 --hf --decode_batch_sizes=1,32 --prompt_len=128 \
      --new_tokens=512
    # DECODE_BASE: txf before a decoding change (made as .ab_base is, above),
    # its batch-1 decoding timed in the same call as the change's.
    if [ -n "${DECODE_BASE:-}" ]; then
      (cd "$DECODE_BASE" && bench decode_before 120 decode $GPT2 --decode_batch_sizes=1 \
        --prompt_len=128 --new_tokens=512) || failures=$(( failures + 1 ))
    fi
    XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" \
      bench decode_command_buffers 120 decode $GPT2 --decode_batch_sizes=1,32 \
      --prompt_len=128 --new_tokens=512
    bench replicas 60 replicas --config=configs/base.py --replicas=3
    bench replicas_runs 180 replicas --config=configs/base.py --replicas=3 --runs \
      --config.train.steps=200 --config.eval.every=100 --config.train.checkpoint_every=100
    ;;
  sweep)
    # SWEEP_CONFIG (configs/sweeps/pe_ln_gpu.py; a setting after a colon, e.g.
    # configs/sweeps/t5_distance.py:gpu) with SWEEP_WORKERS workers (6), each
    # taking every sixth point (--index runs one point; points lock their own
    # directories): compiles run on the CPU while other points train.
    # At SWEEP_LIMIT seconds each worker gets a SIGTERM, which saves the point
    # training then; --summarize tabulates the points that finished.
    sweep_config=${SWEEP_CONFIG:-configs/sweeps/pe_ln_gpu.py}
    sweep_name=$(basename "${sweep_config%%:*}" .py)${sweep_config##*.py}
    sweep_dir=$dir/${sweep_name/:/_}
    points=$(timeout 120 python3 -m experiments.sweep --config="$sweep_config" \
      --workdir="$sweep_dir" --dry_run 2>/dev/null | grep -c '^point ')
    [ "$points" -gt 0 ] || { echo "sweep: $sweep_config has no points"; exit 2; }
    workers=${SWEEP_WORKERS:-6}
    export XLA_PYTHON_CLIENT_MEM_FRACTION=0.12
    deadline=$(( $(date +%s) + ${SWEEP_LIMIT:-560} ))
    sweep_worker() {  # sweep_worker FIRST: points FIRST, FIRST + workers, ... until the deadline;
      # a point stopped at the deadline (124: it saved) resumes next call, any other failure is FAILED
      for index in $(seq "$1" "$workers" $(( points - 1 ))); do
        local left=$(( deadline - $(date +%s) ))
        [ "$left" -gt 0 ] || return 0
        timeout -k 60 "$left" python3 -m experiments.sweep --config="$sweep_config" \
          --workdir="$sweep_dir" --index="$index" ${SWEEP_EXTRA:-}
        local status=$?
        [ "$status" = 0 ] || [ "$status" = 124 ] || echo "FAILED: sweep point $index (exit $status)" \
          | tee -a "$failed_points"
      done
    }
    failed_points=$dir/failed_points.txt  # this call's
    : > "$failed_points"
    pids=()
    for (( worker = 0; worker < workers && worker < points; worker++ )); do
      sweep_worker $worker >> "$dir/worker_$worker.log" 2>&1 &  # appended: a resumed sweep's too
      pids+=($!)
    done
    start=$SECONDS
    wait "${pids[@]}"
    echo "sweep: $sweep_config, $points points, $(( SECONDS - start )) s" | tee -a "$dir/log.txt"
    tee -a "$dir/log.txt" < "$failed_points"
    failures=$(( failures + $(wc -l < "$failed_points") ))
    timeout 300 python3 -m experiments.sweep --config="$sweep_config" --workdir="$sweep_dir" \
      --summarize ${SWEEP_EXTRA:-} 2>&1 | tee -a "$dir/log.txt"
    status=${PIPESTATUS[0]}
    [ "$status" = 0 ] || failed "sweep --summarize" "$status"
    kill "$smi" 2>/dev/null
    tar -czf "$OUT/$part.tar.gz" --exclude=checkpoints -C gpu_results "$part"
    exit $(( failures > 0 ))
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
kill "$smi" 2>/dev/null
tar -czf "$OUT/$part.tar.gz" -C "$dir/.." "$part"
python3 benchmarks/summarize.py "$dir"
[ "$failures" = 0 ] || echo "$part: $failures benchmark(s) FAILED (above)"
exit $(( failures > 0 ))
