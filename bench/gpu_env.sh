# Sourced by bench/*_device.sh on the lent GPU machine (no mlx, no network): install_mlx
# installs mlx 0.32.4's CUDA build from the parts staged in $ST into $PKG, once per warm
# machine, and puts it on PYTHONPATH. $ST holds the mlx wheel, cuda_rest.tar.xz (the
# mlx-cuda-13 wheel's files without mlx/lib/libmlx.so) and libmlx.so as two xz parts
# (libmlx.xz.aa, libmlx.xz.ab: each under a call's size limit). <dir>/nvidia links to the
# image's CUDA 13 packages (libmlx.so's RPATH is $ORIGIN/../../nvidia/...).
# Usage: install_mlx [EXTRA_WHEEL...]   (pure-Python wheels beside mlx, e.g. mlx-lm)
install_mlx() {
    if [ ! -f "$PKG/mlx/lib/libmlx.so" ]; then
        cat "$ST"/libmlx.xz.aa "$ST"/libmlx.xz.ab > "$ST"/libmlx.so.xz
        md5sum "$ST"/libmlx.so.xz  # 0a5dc8e82e2b60859c11217ef0905bdf when whole
        mkdir -p "$PKG"
        python3 -m pip install -q --no-index --no-deps --target "$PKG" \
            "$ST"/mlx-0.32.4-*.whl "$@"
        tar xJf "$ST"/cuda_rest.tar.xz -C "$PKG"
        xz -dc "$ST"/libmlx.so.xz > "$PKG"/mlx/lib/libmlx.so
        site=$(python3 -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))")
        ln -sfn "$site/nvidia" "$PKG/nvidia"
    fi
    export PYTHONPATH=$PKG
    python3 -c "import mlx.core as mx; print(mx.__version__, mx.default_device())"
}
