/* The Open MPI peer of `troupe bench allreduce`: MPI_Allreduce (float sum)
 * timed the way troupe's ranks time theirs (warm-up, barrier, a fixed count
 * of all-reduces per trial, the median of the trials on rank 0).
 *
 *   mpirun -np N troupe_mpi_allreduce TRIALS SIZE[,SIZE...]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int iterations(unsigned long long bytes) {
  if (bytes <= (64u << 10)) return 2000;
  if (bytes <= (4u << 20)) return 100;
  return 5;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 3) {
    fprintf(stderr, "usage: troupe_mpi_allreduce TRIALS SIZE[,SIZE...]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int trials = atoi(argv[1]);
  char* list = strdup(argv[2]);
  for (char* tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    const unsigned long long bytes = strtoull(tok, NULL, 10);
    const size_t count = (size_t)(bytes / 4);
    float* buf = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; ++i) buf[i] = 1.0f;
    const int iters = iterations(bytes);
    for (int i = 0; i < (iters < 20 ? iters : 20); ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double t[32];
    for (int k = 0; k < trials && k < 32; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        buf[0] = 1.0f;
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      t[k] = (MPI_Wtime() - start) * 1e6 / iters;
    }
    const int n = trials < 32 ? trials : 32;
    qsort(t, (size_t)n, sizeof(double), cmp);
    if (rank == 0) {
      printf("RESULT %llu %.3f\n", bytes, t[n / 2]);
      fflush(stdout);
    }
    free(buf);
  }
  free(list);
  MPI_Finalize();
  return 0;
}
