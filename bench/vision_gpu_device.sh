#!/bin/bash
# Runs bench/vision_gpu.py on the lent GPU machine, which has no mlx and no network.
#
# What travels (all under .whl/, which .gitignore ignores; name it in the run's `carry`):
#   mlx-0.32.4-cp312-...whl, mlx_vlm-0.7.10-py3-none-any.whl, cuda_rest.tar.xz (the
#   mlx-cuda-13 0.32.4 wheel's files without mlx/lib/libmlx.so), tok/ (the starter's
#   tokenizer files), and libmlx.so (stripped, xz -9e) in two parts, libmlx.xz.aa and
#   libmlx.xz.ab, each under the per-call size limit, so they go in two calls in a row:
#     call 1: bash bench/vision_gpu_device.sh stage     (carry .whl with part aa)
#     call 2: bash bench/vision_gpu_device.sh run ARGS  (carry .whl with part ab)
#   /tmp stays while the machine is warm (30 s after a call).
# Installed with pip --no-deps --target; <dir>/nvidia links to the image's CUDA 13 packages
# (libmlx.so's RPATH is $ORIGIN/../../nvidia/...). Everything else mlx-vlm imports for
# qwen2_5_vl (transformers, tokenizers, numpy, Pillow, jinja2, huggingface_hub, ...) is in
# the GPU image already.
set -euo pipefail
ST=/tmp/vstage
PKG=/tmp/vpkgs
mode=${1:-run}; shift || true
mkdir -p "$ST"
cp -r .whl/. "$ST"/
if [ "$mode" = stage ]; then
    ls -la "$ST"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -V
    python3 -c "import PIL, transformers, tokenizers, jinja2, huggingface_hub; \
print('PIL', PIL.__version__, 'transformers', transformers.__version__)"
    exit 0
fi
source bench/gpu_env.sh
install_mlx "$ST"/mlx_vlm-0.7.10-*.whl
python3 bench/vision_gpu.py --tokenizer "$ST/tok" --dir /tmp/vision_gpu "$@"
