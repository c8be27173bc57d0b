#!/usr/bin/env bash
# This machine's rates as `trident plan` takes them (--gemm-tflops --mem-bw --intra-bw
# --inter-bw --latency-us), measured with N ranks of one thread running at once, as
# scripts/bench_plan_search.py runs its layouts: prints the flags on one line, for its --rates.
#   GEMM rate    the peak `trident bench` measures at start-up with the config at one thread a
#                rank, N ranks at once (the most any rank reached: docs/FORMULAS.md, Peaks)
#   memory       a triad (z = x + 3y over 3 x 128 MiB) on every rank at once: the least rank's
#                bytes read and written a second
#   bandwidth    MPI_Allreduce of 16 MiB of floats over the N ranks: the bytes a rank sends,
#                2(N-1)/N of the vector's (docs/FORMULAS.md, Communication per step), over the
#                time, as the planner divides them; given as both intra and inter-node
#   latency      MPI_Allreduce of one float, the mean of 2000 calls
# The MPI programme is compiled here with mpicc, into a temporary folder.
#
# Usage: scripts/machine_rates.sh --config C.yaml [--gpus 4] [--mpirun CMD] [--trident PATH]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config=""
ranks=4
mpirun="mpirun --oversubscribe"
trident=$root/build/trident
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --gpus) ranks=$2; shift 2 ;;
    --mpirun) mpirun=$2; shift 2 ;;
    --trident) trident=$2; shift 2 ;;
    *) echo "machine_rates: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $config ]] || { echo "machine_rates: --config C.yaml is required" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/rates.c" <<'EOF'
/* Prints "latency_us bandwidth_gbs triad_gbs", the least rank's triad. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double allreduce_seconds(size_t floats, int calls) {
    float* a = calloc(floats, sizeof(float));
    float* b = calloc(floats, sizeof(float));
    for (int i = 0; i < 5; ++i) MPI_Allreduce(a, b, (int)floats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int i = 0; i < calls; ++i)
        MPI_Allreduce(a, b, (int)floats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t = (MPI_Wtime() - t) / calls;
    free(a);
    free(b);
    return t;
}

static double triad_gbs(void) {
    const size_t n = (size_t)16 << 20;
    double* x = malloc(n * sizeof(double));
    double* y = malloc(n * sizeof(double));
    double* z = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; ++i) x[i] = 1, y[i] = 2, z[i] = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
        double t = MPI_Wtime();
        for (size_t i = 0; i < n; ++i) z[i] = x[i] + 3.0 * y[i];
        t = MPI_Wtime() - t;
        if (t < best) best = t;
    }
    double gbs = 3.0 * (double)n * sizeof(double) / best / 1e9 + 0 * z[n / 2];
    free(x);
    free(y);
    free(z);
    return gbs;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const double latency = allreduce_seconds(1, 2000);
    const size_t floats = (size_t)4 << 20;
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const double sent = 2.0 * (n - 1) / n * (double)(floats * sizeof(float));
    const double bandwidth = sent / allreduce_seconds(floats, 10);
    double triad = triad_gbs(), least;
    MPI_Reduce(&triad, &least, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%.3g %.3g %.3g\n", latency * 1e6, bandwidth / 1e9, least);
    MPI_Finalize();
    return 0;
}
EOF
mpicc -O2 -o "$tmp/rates" "$tmp/rates.c"
read -r latency bandwidth memory < <($mpirun -np "$ranks" "$tmp/rates")
# One step of one sample a rank: any config's batch keys would do, but N must divide them.
gemm=$($mpirun -np "$ranks" "$trident" bench --config "$config" --steps 1 --warmup 0 \
         --set training.threads=1 --set parallel.data="$ranks" --set training.micro_batch=1 \
         --set training.global_batch="$ranks" | sed -n 's/.*"peak_tflops": \([0-9.e+-]*\).*/\1/p')
[[ -n $gemm ]] || { echo "machine_rates: trident bench printed no peak_tflops" >&2; exit 1; }
echo "--gemm-tflops $gemm --mem-bw $memory --intra-bw $bandwidth --inter-bw $bandwidth" \
     "--latency-us $latency"
