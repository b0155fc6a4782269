#!/usr/bin/env bash
# Builds troupe's binaries on this machine and packs them, with every shared library they load
# that the `device` tool's bare machine lacks, into .gpu/ for the device tool to carry. Adapted
# from ../shared/gpu/pack.sh (whose README explains the device machine): the same bundle and
# run.sh, plus two knobs for running troupe's CPU path on the lent many-core host:
#   TROUPE_DEVICE_CUDA=ON|OFF   build the CUDA kernels (default ON; OFF for CPU-only runs)
#   TROUPE_DEVICE_MARCH=ARCH    compile for -march=ARCH instead of a generic x86-64, e.g.
#                               x86-64-v4 (AVX-512), what a user building on that host with
#                               the default TROUPE_NATIVE=ON gets, without naming its exact model
#
#   scripts/device_pack.sh [TARGET...]     (default targets: kernels_cuda_test
#                                           nccl_communicator_test troupe)
# Then, with the device tool:  run  command: "bash .gpu/run.sh troupe version"  carry: [".gpu"]
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(kernels_cuda_test nccl_communicator_test troupe)
build=${TROUPE_GPU_BUILD:-/tmp/troupe-device-build}
cuda=${TROUPE_DEVICE_CUDA:-ON}
march=${TROUPE_DEVICE_MARCH:-}
out="$root/.gpu"

scripts/setup.sh --no-build >/dev/null
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA="$cuda" -DTROUPE_NATIVE=OFF \
  -DCMAKE_CXX_FLAGS="${march:+-march=$march}" -DCMAKE_CUDA_ARCHITECTURES=90 >"$build/configure.log" 2>&1 \
  || { tail -20 "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${TROUPE_JOBS:-2}" --target "${targets[@]}"

exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}"; do
  f=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  [ -n "$f" ] || { echo "pack: no binary for target $t" >&2; exit 1; }
  cp "$f" "$out/bin/" && strip --strip-unneeded "$out/bin/$t"
  # Every library the binary loads from the Debian system, except glibc's own and the CUDA
  # install's (the device brings a matching driver and CUDA runtime).
  ldd "$f" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$lib" in
      */libc.so*|*/libm.so*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/ld-linux*) ;;
      */libstdc++.so*|*/libgcc_s.so*) ;;  # the device's own are newer, and cuBLAS needs them
      /usr/local/cuda*|*/libcuda.so*|*/libnvidia*|*/libcudart*|*/libcublas*|*/libnccl*) ;;
      *) cp -L -n "$lib" "$out/lib/" ;;
    esac
  done
done
# UCX loads its transports as plugins at run time.
if [ -d /usr/lib/x86_64-linux-gnu/ucx ]; then cp -rL /usr/lib/x86_64-linux-gnu/ucx "$out/lib/ucx"; fi
# One compressed archive keeps the carried tree well under the device tool's 64 MiB.
tar -C "$out" -cJf "$out/bundle.tar.xz" bin lib && rm -rf "$out/bin" "$out/lib"
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs one packed binary on the device machine: bash .gpu/run.sh NAME [ARGS...]
src=$(cd "$(dirname "$0")" && pwd)
here=/tmp/troupe-gpu
if [ ! -x "$here/bin/$1" ] || [ "$src/bundle.tar.xz" -nt "$here/.unpacked" ]; then
  rm -rf "$here"; mkdir -p "$here" && tar -C "$here" -xJf "$src/bundle.tar.xz" && touch "$here/.unpacked"
fi
# cuBLAS, NCCL and the CUDA runtime are too large to carry: use the device's own (the CUDA
# install's, or the copies that PyTorch's environment ships).
extra=""
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  d=$(find /usr/local/cuda*/ /usr/lib /opt -name "$name" -print -quit 2>/dev/null | xargs -r dirname)
  [ -n "$d" ] && case ":$extra:" in *":$d:"*) ;; *) extra="$extra:$d" ;; esac
done
export LD_LIBRARY_PATH="$here/lib$extra:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$here/lib/ucx"
name=$1; shift
exec "$here/bin/$name" "$@"
EOF
chmod +x "$out/run.sh"
du -sh "$out"
echo "pack: $out ready; carry \".gpu\" and run \"bash .gpu/run.sh ${targets[0]}\""
