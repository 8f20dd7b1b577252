/* bench/peers/mpi_peers.c: the collectives of bench/peers/run.py timed on an
 * MPI library, with the method every library of that run gets: per (op,
 * size), barrier, one warm-up op, barrier, then N ops each timed on its own;
 * rank 0 prints the median. fp32, SUM, one process per rank.
 *
 *   mpirun -np W mpi_peers_LIB --ops all_reduce,all_gather --sizes 8,4096 \
 *       [--max_iters 200] [--lib NAME]
 *   mpi_peers_memcpy --sizes 8,4096 [--max_iters 200]   (built with
 *       -DPEERS_MEMCPY_ONLY: single-thread memcpy of the same bytes, no MPI)
 *   mpi_peers_memcpy --pingpong 20000   (same build: the round trip of one
 *       cache line between two threads pinned to the first two CPUs, the
 *       host's core-to-core latency, which every shm collective pays per
 *       synchronisation; rank 0's line as above with "op": "round_trip")
 *
 * Sizes follow bench/README.md: the largest buffer a rank touches (the
 * tensor of all_reduce and broadcast, the gathered output of all_gather, the
 * full input of reduce_scatter, the whole send buffer of all_to_all); split
 * ops round it down to a multiple of world x 4 B, at least that. N =
 * clamp(512 MiB / size, 5, max_iters), as collectives_bench --max_iters.
 * Output, rank 0, one JSON object per line:
 *   {"lib": "openmpi", "op": "all_reduce", "world": 2, "bytes": 8,
 *    "time_us": 0.31, "iters": 200}
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef PEERS_MEMCPY_ONLY
#include <mpi.h>
#endif

#define MAX_LIST 32

static int split_list(char* s, char** out) {
  int n = 0;
  for (char* t = strtok(s, ","); t != NULL && n < MAX_LIST; t = strtok(NULL, ",")) out[n++] = t;
  return n;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int64_t n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int64_t iterations(int64_t bytes, int64_t max_iters) {
  int64_t n = (int64_t)(512 << 20) / (bytes > 0 ? bytes : 1);
  if (n > max_iters) n = max_iters;
  if (n < 5) n = 5 < max_iters ? 5 : max_iters;
  return n;
}

static void* alloc_filled(int64_t bytes) {
  float* p = malloc((size_t)(bytes > 0 ? bytes : 4));
  if (p == NULL) {
    fprintf(stderr, "mpi_peers: out of memory (%lld bytes)\n", (long long)bytes);
    exit(1);
  }
  for (int64_t i = 0; i < bytes / 4; ++i) p[i] = 1.0f;
  return p;
}

#ifdef PEERS_MEMCPY_ONLY
#include <pthread.h>
#include <sched.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One cache line bounced between two threads: the main thread writes an odd
 * value, the echo thread answers with the next even one. */
static struct {
  _Alignas(64) volatile int64_t ball;
  _Alignas(64) int64_t rounds;
  int cpu;
} pp;

static int pin(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

static void* echo(void* arg) {
  (void)arg;
  if (pin(pp.cpu) != 0) return NULL;
  for (int64_t i = 0; i < pp.rounds; ++i) {
    const int64_t want = 2 * i + 1;
    while (__atomic_load_n(&pp.ball, __ATOMIC_ACQUIRE) != want) {
    }
    __atomic_store_n(&pp.ball, want + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

/* Median round trip over batches of 100, in us, between the first two CPUs
 * this process may run on; < 0 when there are not two. */
static double round_trip_us(int64_t rounds) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  int cpus[2], found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus[found++] = c;
  }
  if (found < 2) return -1;
  const int64_t batch = 100, batches = rounds / batch > 0 ? rounds / batch : 1;
  pp.ball = 0;
  pp.rounds = batches * batch;
  pp.cpu = cpus[1];
  pthread_t t;
  if (pin(cpus[0]) != 0 || pthread_create(&t, NULL, echo, NULL) != 0) return -1;
  double* per = malloc(sizeof(double) * (size_t)batches);
  for (int64_t b = 0; b < batches; ++b) {
    const double t0 = now_s();
    for (int64_t i = b * batch; i < (b + 1) * batch; ++i) {
      __atomic_store_n(&pp.ball, 2 * i + 1, __ATOMIC_RELEASE);
      while (__atomic_load_n(&pp.ball, __ATOMIC_ACQUIRE) != 2 * i + 2) {
      }
    }
    per[b] = (now_s() - t0) / (double)batch;
  }
  pthread_join(t, NULL);
  const double m = median(per, batches) * 1e6;
  free(per);
  sched_setaffinity(0, sizeof(allowed), &allowed);
  return m;
}

int main(int argc, char** argv) {
  char* sizes_arg = NULL;
  int64_t max_iters = 200;
  int64_t pingpong = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--sizes") == 0) sizes_arg = argv[i + 1];
    else if (strcmp(argv[i], "--max_iters") == 0) max_iters = atoll(argv[i + 1]);
    else if (strcmp(argv[i], "--pingpong") == 0) pingpong = atoll(argv[i + 1]);
  }
  if (pingpong > 0) {
    const double us = round_trip_us(pingpong);
    if (us < 0) {
      fprintf(stderr, "mpi_peers_memcpy: --pingpong needs two CPUs to pin to\n");
      return 1;
    }
    printf("{\"lib\": \"pingpong\", \"op\": \"round_trip\", \"world\": 2, \"bytes\": 64, "
           "\"time_us\": %.4f, \"iters\": %lld}\n", us, (long long)pingpong);
    return 0;
  }
  if (sizes_arg == NULL || max_iters < 1) {
    fprintf(stderr, "usage: mpi_peers_memcpy --sizes 8,4096 [--max_iters N]\n");
    return 2;
  }
  char* sizes[MAX_LIST];
  const int n_sizes = split_list(sizes_arg, sizes);
  for (int s = 0; s < n_sizes; ++s) {
    const int64_t bytes = atoll(sizes[s]);
    /* dst - src = 2048 mod 4096. Two malloc'ed blocks in a row sit 16 B
     * apart mod 4096, and on CPUs with FSRM (AMD EPYC here) glibc's rep movsb
     * is then many times slower (4 KiB 1.38 vs 0.071 us, 64 KiB 22.9 vs
     * 1.95 us, measured 2026-12-07): a pathology of that pair of addresses,
     * not the memory reference this column is for. */
    char* src = alloc_filled(bytes);
    char* dst_block = alloc_filled(bytes + 4096);
    char* dst = dst_block + ((uintptr_t)src + 2048 - (uintptr_t)dst_block) % 4096;
    const int64_t n = iterations(bytes, max_iters);
    double* t = malloc(sizeof(double) * (size_t)n);
    memcpy(dst, src, (size_t)bytes); /* warm-up: page faults */
    for (int64_t i = 0; i < n; ++i) {
      const double t0 = now_s();
      memcpy(dst, src, (size_t)bytes);
      __asm__ volatile("" : : "r"(dst) : "memory"); /* the copy is used */
      t[i] = now_s() - t0;
    }
    printf("{\"lib\": \"memcpy\", \"op\": \"memcpy\", \"world\": 1, \"bytes\": %lld, "
           "\"time_us\": %.4f, \"iters\": %lld}\n",
           (long long)bytes, median(t, n) * 1e6, (long long)n);
    free(t);
    free(src);
    free(dst_block);
  }
  return 0;
}

#else

/* Rounds a split op's size to world x 4 B (down, at least one element each). */
static int64_t round_to_world(int64_t size, int world) {
  const int64_t unit = (int64_t)world * 4;
  const int64_t r = size / unit * unit;
  return r > unit ? r : unit;
}

/* Runs op once. buf/out: the op's buffers, count: elements of `bytes`. */
static int run_op(const char* op, float* in, float* out, int64_t count, int world) {
  if (strcmp(op, "all_reduce") == 0) {
    return MPI_Allreduce(MPI_IN_PLACE, in, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  if (strcmp(op, "reduce_scatter") == 0) {
    return MPI_Reduce_scatter_block(in, out, (int)(count / world), MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
  }
  if (strcmp(op, "all_gather") == 0) {
    return MPI_Allgather(in, (int)(count / world), MPI_FLOAT, out, (int)(count / world),
                         MPI_FLOAT, MPI_COMM_WORLD);
  }
  if (strcmp(op, "broadcast") == 0) {
    return MPI_Bcast(in, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  if (strcmp(op, "all_to_all") == 0) {
    return MPI_Alltoall(in, (int)(count / world), MPI_FLOAT, out, (int)(count / world), MPI_FLOAT,
                        MPI_COMM_WORLD);
  }
  return -1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  char* ops_arg = NULL;
  char* sizes_arg = NULL;
  const char* lib = "mpi";
  int64_t max_iters = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--ops") == 0) ops_arg = argv[i + 1];
    else if (strcmp(argv[i], "--sizes") == 0) sizes_arg = argv[i + 1];
    else if (strcmp(argv[i], "--max_iters") == 0) max_iters = atoll(argv[i + 1]);
    else if (strcmp(argv[i], "--lib") == 0) lib = argv[i + 1];
  }
  if (ops_arg == NULL || sizes_arg == NULL || max_iters < 1) {
    if (rank == 0) fprintf(stderr, "usage: mpi_peers --ops a,b --sizes 8,4096 [--max_iters N]\n");
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    for (char* c = version; *c; ++c) {
      if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = ' ';
    }
    printf("{\"lib\": \"%s\", \"library_version\": \"%s\"}\n", lib, version);
  }
  char* ops[MAX_LIST];
  char* sizes[MAX_LIST];
  const int n_ops = split_list(ops_arg, ops);
  const int n_sizes = split_list(sizes_arg, sizes);
  for (int o = 0; o < n_ops; ++o) {
    for (int s = 0; s < n_sizes; ++s) {
      const int split = strcmp(ops[o], "all_reduce") != 0 && strcmp(ops[o], "broadcast") != 0;
      int64_t bytes = atoll(sizes[s]);
      bytes = split ? round_to_world(bytes, world) : (bytes / 4 > 0 ? bytes / 4 * 4 : 4);
      const int64_t count = bytes / 4;
      float* in = alloc_filled(bytes);
      float* out = alloc_filled(bytes);
      const int64_t n = iterations(bytes, max_iters);
      double* t = malloc(sizeof(double) * (size_t)n);
      MPI_Barrier(MPI_COMM_WORLD);
      if (run_op(ops[o], in, out, count, world) != MPI_SUCCESS) {
        if (rank == 0) fprintf(stderr, "mpi_peers: unknown or failed op %s\n", ops[o]);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      for (int64_t i = 0; i < n; ++i) {
        const double t0 = MPI_Wtime();
        run_op(ops[o], in, out, count, world);
        t[i] = MPI_Wtime() - t0;
      }
      if (rank == 0) {
        printf("{\"lib\": \"%s\", \"op\": \"%s\", \"world\": %d, \"bytes\": %lld, "
               "\"time_us\": %.4f, \"iters\": %lld}\n",
               lib, ops[o], world, (long long)bytes, median(t, n) * 1e6, (long long)n);
        fflush(stdout);
      }
      free(t);
      free(in);
      free(out);
    }
  }
  MPI_Finalize();
  return 0;
}

#endif
