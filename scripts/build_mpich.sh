#!/usr/bin/env bash
# Builds the trident binary against MPICH instead of Open MPI (the default build's MPI), into
# build-mpich/, to show that Trident needs only standard MPI-3 and to test it under MPICH's
# mpiexec (ctest mpi.mpich.*). Only the binary is built, not the tests. CMake's FindMPI is
# pointed at MPICH's compiler wrapper, whose include path (/usr/include/x86_64-linux-gnu/mpich)
# is the only MPI one the build gets; the result is checked to link libmpich and not
# Open MPI's libmpi.
# Usage: scripts/build_mpich.sh [BUILD_DIR] [CMAKE_ARGS...]   (default BUILD_DIR: build-mpich)
# Needs Debian's mpich and libmpich-dev (scripts/setup.sh --tests installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-mpich}
[[ $# -gt 0 ]] && shift
for tool in mpicxx.mpich mpiexec.mpich; do
  command -v "$tool" >/dev/null || {
    echo "build_mpich: $tool not found: install Debian's mpich and libmpich-dev" >&2; exit 1; }
done
compiler=$(command -v mpicxx.mpich)
launcher=$(command -v mpiexec.mpich)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_TESTS=OFF \
  -DTRIDENT_CUDA=OFF -DMPI_CXX_COMPILER="$compiler" -DMPIEXEC_EXECUTABLE="$launcher" "$@" >/dev/null
cmake --build "$build" --target trident -j "$(nproc)"

# The wrong MPI would show here: an Open MPI header or library in the build.
if grep -q openmpi "$build/compile_commands.json"; then
  echo "build_mpich: an Open MPI path is in $build/compile_commands.json" >&2; exit 1
fi
libs=$(ldd "$build/trident")
if ! grep -q libmpich <<<"$libs" || grep -q 'libmpi\.so' <<<"$libs"; then
  echo "build_mpich: $build/trident does not link MPICH alone:" >&2
  grep -i mpi <<<"$libs" >&2
  exit 1
fi
echo "build_mpich: $build/trident, linked with $(grep -o 'libmpich[^ ]*' <<<"$libs" | head -n 1)"
