#!/bin/bash
# Runs bench/draft.py on the lent GPU machine (no mlx, no network) against the random
# Llama-3-8B-shaped 4-bit model of bench/random_model.py, drafted by its own first layers.
#
# What travels (under .whl/, ignored by git), in two calls within the machine's warm window
# (each call's `carry` is limited): .whl/a holds the mlx 0.32.4 and mlx-lm 0.32.2 wheels,
# cuda_rest.tar.xz, tok/ (the starter's tokenizer files) and libmlx.so's first xz part;
# .whl/b its second part (bench/vision_gpu_device.sh says how they are made):
#   call 1: bash bench/draft_gpu_device.sh stage     (carry .whl/a)
#   call 2: bash bench/draft_gpu_device.sh run       (carry .whl/b)
set -euo pipefail
ST=/tmp/dstage
PKG=/tmp/dpkgs
mode=${1:-run}
mkdir -p "$ST"
for part in a b; do [ -d .whl/$part ] && cp -r .whl/$part/. "$ST"/; done
if [ "$mode" = stage ]; then
    ls -la "$ST"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    exit 0
fi
source bench/gpu_env.sh
install_mlx "$ST"/mlx_lm-0.32.2-*.whl
[ -f /tmp/r8b/config.json ] || python3 bench/random_model.py /tmp/r8b --tokenizer "$ST/tok"
for layers in 4 32; do
    python3 bench/draft.py --model /tmp/r8b --layers "$layers" --tokens 128
done
