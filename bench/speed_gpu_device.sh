#!/bin/bash
# Issue 29's GPU figures on the lent machine (no mlx, no network): compiled decode
# (bench/compiled.py), speculative decoding (bench/draft.py) and concurrency layer by
# layer (bench/concurrency.py), on the random Llama-3-8B-shaped 4-bit model of
# bench/random_model.py.
#
# What travels (under .whl/, ignored by git), in calls made within the machine's warm
# window (30 s): .whl/a holds the mlx 0.32.4 and mlx-lm 0.32.2 wheels, cuda_rest.tar.xz,
# tok/ (the starter's tokenizer files) and libmlx.so's first xz part; .whl/b its second
# part and the wheels mlx-kit's server needs that the GPU image lacks (fastapi, starlette,
# pydantic and pydantic-core, pydantic-settings, uvicorn, sse-starlette, llguidance,
# platformdirs, ruamel.yaml, tomlkit, json-five, fastapi-offline and their small needs);
# bench/vision_gpu_device.sh says how libmlx.so is split.
#   call 1: bash bench/speed_gpu_device.sh stage   (carry .whl/a)
#   call 2: bash bench/speed_gpu_device.sh all     (carry .whl/b): compiled decode
#           in-process, the hand-back (bench/handback.py), concurrency, then drafting,
#           each under its own timeout (COMPILED_S, HANDBACK_S, CONCURRENCY_S, DRAFT_S:
#           100 / 60 / 270 / 60 s, with the install and model build ~70 s); each step
#           added below (DRAFT_BITS_S, DRAFT_PAIR_S, CONCURRENCY2_S, and a model build)
#           must be paid for by shortening others (1 skips a step) to end inside the
#           10-minute limit; what each measured is in $OUT/*.log;
#           DRAFT_BITS=2 also drafts with a 2-bit copy of the same weights, in-process and
#           through mlx-kit; DRAFT_PAIR=N drafts for a copy whose layers after the
#           first N barely write (bench/random_model.py --pair) with those N layers, a pair
#           that agrees (drafting's best case), in-process and through mlx-kit;
#           PROFILE=1 profiles the engine layer (which slows it); CONCURRENCY_ARGS
#           replaces bench/concurrency.py's --mlx-lm-server, PAIR_ARGS the pair's --server
set -euo pipefail
ST=/tmp/sstage
PKG=/tmp/spkgs
mode=${1:-single}
mkdir -p "$ST"
for part in a b; do [ -d .whl/$part ] && cp -r .whl/$part/. "$ST"/; done
if [ "$mode" = stage ]; then
    ls -la "$ST"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    exit 0
fi
source bench/gpu_env.sh
install_mlx $(ls "$ST"/*.whl | grep -v '/mlx-0.32.4-')
export PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/ptx  # one kernel cache for every run
[ -f /tmp/r8b/config.json ] || python3 bench/random_model.py /tmp/r8b --tokenizer "$ST/tok"
out=${OUT:-/tmp}
timeout ${COMPILED_S:-100} python3 bench/compiled.py --model /tmp/r8b --tokens 128 --rounds 2 \
    2>&1 | tee "$out/compiled.log" || true
timeout ${HANDBACK_S:-60} python3 bench/handback.py --model /tmp/r8b --long 256 --rounds 2 \
    2>&1 | tee "$out/handback.log" || true
timeout ${CONCURRENCY_S:-270} python3 bench/concurrency.py --model /tmp/r8b --tokens 128 \
    --levels ${LEVELS:-1,2,4,8} ${CONCURRENCY_ARGS---mlx-lm-server} ${PROFILE:+--profile} \
    2>&1 | tee "$out/concurrency.log" || true
# CONCURRENCY2_ARGS: a second run beside it (e.g. "--skip batch,engine --compile-decode on")
if [ -n "${CONCURRENCY2_ARGS:-}" ]; then
    timeout ${CONCURRENCY2_S:-120} python3 bench/concurrency.py --model /tmp/r8b --tokens 128 \
        --levels ${LEVELS:-1,2,4,8} $CONCURRENCY2_ARGS 2>&1 | tee "$out/concurrency2.log" || true
fi
timeout ${DRAFT_S:-60} python3 bench/draft.py --model /tmp/r8b --layers 4 --tokens 128 \
    2>&1 | tee "$out/draft.log" || true
# a low-bit copy of the same random weights (the same seed), through mlx-kit too
if [ -n "${DRAFT_BITS:-}" ]; then
    d=/tmp/r8b-$DRAFT_BITS
    [ -f $d/config.json ] || python3 bench/random_model.py $d --tokenizer "$ST/tok" --bits $DRAFT_BITS
    timeout ${DRAFT_BITS_S:-300} python3 bench/draft.py --model /tmp/r8b --draft $d --tokens 128 \
        --server 2>&1 | tee "$out/draft-$DRAFT_BITS.log" || true
fi
# a pair that agrees: acceptance near 1, the target's cost unchanged
if [ -n "${DRAFT_PAIR:-}" ]; then
    p=/tmp/r8b-pair$DRAFT_PAIR
    [ -f $p-draft/config.json ] || python3 bench/random_model.py $p --tokenizer "$ST/tok" --pair $DRAFT_PAIR
    timeout ${DRAFT_PAIR_S:-300} python3 bench/draft.py --model $p --draft $p-draft --tokens 128 \
        ${PAIR_ARGS---server} 2>&1 | tee "$out/draft-pair$DRAFT_PAIR.log" || true
fi
