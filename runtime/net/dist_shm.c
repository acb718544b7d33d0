/* dist_shm.c — the all-reduce of host buffers among the ranks of one machine through one
   shared-memory window, instead of MPI_Allreduce's pipes (OpenMPI's vader moved gradients at
   ~0.3 GB/s here, 40% of an SFT step at 50M parameters).

   A round takes one chunk of the buffer (bounded: CLRT_DIST_SHM_CHUNK bytes, default 8 MiB):
   every rank copies its chunk into its own area of the window; barrier; each local rank sums
   its slice of the chunk over every rank's copy, always in local-rank order 0, 1, ..., so
   every rank ends with the same bits whatever the timing; with several machines the ranks
   holding the same slice all-reduce it over MPI (one communicator per local rank); barrier;
   every rank copies all the summed slices back. A rank that dies leaves the others in an
   MPI_Barrier, which the launcher ends as it ends MPI's own collectives.

   The sharded optimizer step's reduce-scatter and all-gather (slices by dist_shm_slice,
   clrt_dist_slice's rule) read the other ranks' buffers directly when the kernel lets them
   (process_vm_readv), or else stage through the same window. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* process_vm_readv */
#endif
#include "dist_shm.h"

#include <stdint.h>

#ifdef CLRT_HAVE_MPI
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clrt.h"

enum { SLICE_ALIGN = 64 };   /* bytes: slices start on their own cache line */

static int state;            /* 0: not set up, 1: on, 2: this job does not use it */
static MPI_Comm node;        /* the ranks sharing this machine's memory */
static MPI_Comm cross = MPI_COMM_NULL;  /* the ranks with this local rank on every machine */
static int local_size, local_rank, world_ranks = 1;   /* world_ranks: MPI_COMM_WORLD's size */
static MPI_Win win;
static char **area;          /* area[q]: local rank q's copy of the chunk, then its summed slice */
static const void **srcs;    /* one slice of every local rank's chunk, in local-rank order */
static size_t chunk;         /* bytes of one round, a multiple of SLICE_ALIGN */
static pid_t *pids;          /* the local ranks' processes, when cma */
static int cma;              /* the reduce-scatter and all-gather read the others' buffers
                                directly (process_vm_readv): no staging copy in the window */

static size_t chunk_bytes(void) {
  const char *s = getenv("CLRT_DIST_SHM_CHUNK");
  long long v = s ? atoll(s) : 0;
  if (v <= 0) v = 8LL << 20;
  if (v > 1LL << 30) v = 1LL << 30;   /* an MPI count of f32 stays an int */
  return (size_t)(v + SLICE_ALIGN - 1) / SLICE_ALIGN * SLICE_ALIGN;
}

/* A rank's area: its copy of a round, then its summed slice, which is at most a 1/local_size
   share of the round rounded up to whole elements and then to whole cache lines. The
   reduce-scatter and the all-gather use it as two halves of a chunk each, in turn. */
static size_t piece_floats(void) {
  size_t line = SLICE_ALIGN / sizeof(float), sub = chunk / sizeof(float) / (size_t)local_size / line * line;
  return sub ? sub : line;
}
static size_t half_bytes(void) {
  size_t staged = piece_floats() * sizeof(float) * (size_t)local_size;
  return staged > chunk ? staged : chunk;
}
static size_t area_bytes(void) { return 2 * half_bytes() + 2 * SLICE_ALIGN; }

/* Every local rank reads a word of every other's memory; the job uses direct reads when all
   of them could (the kernel allows it between processes of one user unless ptrace is
   restricted; CLRT_DIST_CMA=0 turns it off) and the ranks are all on this machine. */
static int cma_setup(int world_size) {
  static volatile uint64_t probe;
  probe = 0x636c7274u + (uint64_t)local_rank;
  struct { uint64_t pid, addr; } mine = { (uint64_t)getpid(), (uint64_t)(uintptr_t)&probe }, *all;
  all = calloc((size_t)local_size, sizeof *all);
  pids = calloc((size_t)local_size, sizeof *pids);
  if (!all || !pids) {
    free(all);
    clrt_set_error("dist: out of memory");
    return -1;
  }
  MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node);
  const char *off = getenv("CLRT_DIST_CMA");
  int ok = world_size == local_size && !(off && strcmp(off, "0") == 0);
  for (int q = 0; q < local_size && ok; q++) {
    pids[q] = (pid_t)all[q].pid;
    uint64_t got = 0;
    struct iovec l = { &got, sizeof got }, r = { (void *)(uintptr_t)all[q].addr, sizeof got };
    ok = process_vm_readv(pids[q], &l, 1, &r, 1, 0) == (ssize_t)sizeof got && got == 0x636c7274u + (uint64_t)q;
  }
  free(all);
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  cma = ok;
  return 0;
}

static int setup(void) {
  int world_rank, world_size;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  world_ranks = world_size;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  /* For tests: machines of k ranks each on one machine, to take the path between machines. */
  const char *k = getenv("CLRT_DIST_RANKS_PER_NODE");
  if (k && atoi(k) > 0) {
    MPI_Comm part;
    MPI_Comm_split(node, world_rank / atoi(k), world_rank, &part);
    MPI_Comm_free(&node);
    node = part;
  }
  MPI_Comm_size(node, &local_size);
  MPI_Comm_rank(node, &local_rank);
  const char *off = getenv("CLRT_DIST_SHM");
  chunk = chunk_bytes();
  /* OpenMPI backs the window with a file in /dev/shm, often small in containers (Docker:
     64 MiB), where a window larger than the room left dies of SIGBUS at its first touch */
  struct statvfs fs;
  int fits = statvfs("/dev/shm", &fs) != 0 ||
             (double)fs.f_bavail * (double)fs.f_frsize > 2.0 * (double)local_size * (double)area_bytes();
  /* every rank decides alike: the same minimum, maximum, wish and chunk everywhere */
  long long mine[4] = { local_size, -local_size, !(off && strcmp(off, "0") == 0) && fits, -(long long)chunk };
  long long all[4];
  MPI_Allreduce(mine, all, 4, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  if (all[0] < 2 || all[0] != -all[1] || !all[2] || (size_t)-all[3] != chunk) {
    MPI_Comm_free(&node);
    state = 2;
    return 0;
  }
  if (world_size > local_size) MPI_Comm_split(MPI_COMM_WORLD, local_rank, world_rank, &cross);
  area = calloc((size_t)local_size, sizeof *area);
  srcs = calloc((size_t)local_size, sizeof *srcs);
  char *base = NULL;
  int rc = MPI_Win_allocate_shared((MPI_Aint)area_bytes(), 1, MPI_INFO_NULL, node, &base, &win);
  if (!area || !srcs || rc != MPI_SUCCESS) {
    clrt_set_error("dist: the shared all-reduce buffer (%zu bytes a rank) could not be allocated", area_bytes());
    return -1;
  }
  for (int q = 0; q < local_size; q++) {
    MPI_Aint size;
    int unit;
    MPI_Win_shared_query(win, q, &size, &unit, &area[q]);
  }
  MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
  state = 1;
  return cma_setup(world_size);
  return 0;
}

void dist_shm_finalize(void) {
  if (state == 1) {
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Comm_free(&node);
    if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
    free(area);
    free(srcs);
    free(pids);
    area = NULL;
    srcs = NULL;
    pids = NULL;
    cma = 0;
  }
  state = 0;
}

/* Every rank's stores before it, visible to every rank's loads after it. */
static void node_sync(void) {
  MPI_Win_sync(win);
  MPI_Barrier(node);
  MPI_Win_sync(win);
}

/* out[i] = src[0][off + i] op src[1][off + i] op ... in that order, i < n; out aliases none. */
#define REDUCE(NAME, T)                                                                  \
  static void NAME(T *restrict out, const void **src, int nsrc, size_t off, size_t n, int op) { \
    const T *restrict a = (const T *)src[0] + off, *restrict b = (const T *)src[1] + off; \
    if (op == CLRT_DIST_SUM)                                                             \
      for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];                               \
    else if (op == CLRT_DIST_MAX)                                                        \
      for (size_t i = 0; i < n; i++) out[i] = b[i] > a[i] ? b[i] : a[i];                 \
    else                                                                                 \
      for (size_t i = 0; i < n; i++) out[i] = b[i] < a[i] ? b[i] : a[i];                 \
    for (int q = 2; q < nsrc; q++) {                                                     \
      const T *restrict c = (const T *)src[q] + off;                                     \
      if (op == CLRT_DIST_SUM)                                                           \
        for (size_t i = 0; i < n; i++) out[i] += c[i];                                   \
      else if (op == CLRT_DIST_MAX)                                                      \
        for (size_t i = 0; i < n; i++) out[i] = c[i] > out[i] ? c[i] : out[i];           \
      else                                                                               \
        for (size_t i = 0; i < n; i++) out[i] = c[i] < out[i] ? c[i] : out[i];           \
    }                                                                                    \
  }
REDUCE(reduce_f32, float)
REDUCE(reduce_f64, double)

/* A rank's OpenMP threads share its copies and sums in blocks: one thread alone does not
   reach the memory's bandwidth. Elementwise, so the bits do not depend on the threads. */
enum { BLOCK = 1 << 16 };   /* bytes */

static void copy(char *dst, const char *src, size_t bytes) {
  long long blocks = (long long)((bytes + BLOCK - 1) / BLOCK);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (long long k = 0; k < blocks; k++) {
    size_t at = (size_t)k * BLOCK;
    memcpy(dst + at, src + at, bytes - at < BLOCK ? bytes - at : BLOCK);
  }
}

static void reduce(char *out, const void **src, int nsrc, size_t n, int esz, int op) {
  size_t per = BLOCK / (size_t)esz;
  long long blocks = (long long)((n + per - 1) / per);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (long long k = 0; k < blocks; k++) {
    size_t at = (size_t)k * per, m = n - at < per ? n - at : per;
    if (esz == 4) reduce_f32((float *)(void *)out + at, src, nsrc, at, m, op);
    else reduce_f64((double *)(void *)out + at, src, nsrc, at, m, op);
  }
}

/* Local rank q's slice [*lo, *hi) of a round of n elements of esz bytes. */
static void slice(int q, size_t n, size_t esz, size_t *lo, size_t *hi) {
  size_t per = (n + (size_t)local_size - 1) / (size_t)local_size;
  size_t align = SLICE_ALIGN / esz;
  per = (per + align - 1) / align * align;
  *lo = (size_t)q * per < n ? (size_t)q * per : n;
  *hi = *lo + per < n ? *lo + per : n;
}

int dist_shm_all_reduce(void *data, int64_t count, int esz, int op) {
  if (state == 0 && setup()) return -1;
  if (state == 2) return 1;
  size_t per_round = chunk / (size_t)esz;
  char *p = data;
  for (int64_t done = 0; done < count; done += (int64_t)per_round) {
    size_t n = (size_t)(count - done) < per_round ? (size_t)(count - done) : per_round;
    char *mine = p + (size_t)done * (size_t)esz;
    size_t lo, hi;
    slice(local_rank, n, (size_t)esz, &lo, &hi);
    /* the others read every slice but this rank's own, which it reads from its buffer */
    copy(area[local_rank], mine, lo * (size_t)esz);
    copy(area[local_rank] + hi * (size_t)esz, mine + hi * (size_t)esz, (n - hi) * (size_t)esz);
    node_sync();
    char *out = area[local_rank] + chunk;
    if (hi > lo) {
      for (int q = 0; q < local_size; q++) srcs[q] = (q == local_rank ? mine : area[q]) + lo * (size_t)esz;
      reduce(out, srcs, local_size, hi - lo, esz, op);
      if (cross != MPI_COMM_NULL) {
        MPI_Op mop = op == CLRT_DIST_MAX ? MPI_MAX : op == CLRT_DIST_MIN ? MPI_MIN : MPI_SUM;
        MPI_Allreduce(MPI_IN_PLACE, out, (int)(hi - lo), esz == 4 ? MPI_FLOAT : MPI_DOUBLE, mop, cross);
      }
    }
    node_sync();
    /* The next round's copies write only the first halves of the areas, which nobody reads
       now, and its sums wait for its barrier: one barrier a phase is enough. */
    for (int q = 0; q < local_size; q++) {
      size_t qlo, qhi;
      slice(q, n, (size_t)esz, &qlo, &qhi);
      copy(mine + qlo * (size_t)esz, area[q] + chunk, (qhi - qlo) * (size_t)esz);
    }
  }
  return 0;
}
/* ---- the sharded optimizer's collectives (ZeRO-1): f32 sums, slices by world rank -------- */

/* Only with every rank on this machine: the slices are the world ranks', and the window holds
   every rank's area. Several machines take MPI's path (dist.c). */
static int sharded_ok(void) { return state == 1 && cross == MPI_COMM_NULL; }

/* out[i] += src[i] for i < n, and the sum of squares of the results when last. */
static double add_into(float *restrict out, const float *restrict src, size_t n, int last) {
  double ss = 0;
  long long blocks = (long long)((n * sizeof(float) + BLOCK - 1) / BLOCK);
  size_t per = BLOCK / sizeof(float);
#pragma omp parallel for schedule(static) reduction(+ : ss) if (blocks > 1)
  for (long long k = 0; k < blocks; k++) {
    size_t at = (size_t)k * per, m = n - at < per ? n - at : per;
    float *o = out + at;
    const float *c = src + at;
    if (last) {
      double s = 0;
      for (size_t i = 0; i < m; i++) {
        o[i] += c[i];
        s += (double)o[i] * o[i];
      }
      ss += s;
    } else {
      for (size_t i = 0; i < m; i++) o[i] += c[i];
    }
  }
  return ss;
}

/* bytes of local rank q's memory at addr into dst, all of them or -1 with the error set */
static int read_peer(int q, void *dst, uint64_t addr, size_t bytes) {
  while (bytes > 0) {
    struct iovec l = { dst, bytes }, r = { (void *)(uintptr_t)addr, bytes };
    ssize_t n = process_vm_readv(pids[q], &l, 1, &r, 1, 0);
    if (n <= 0) {
      clrt_set_error("dist: reading local rank %d's buffer failed (process_vm_readv)", q);
      return -1;
    }
    dst = (char *)dst + n;
    addr += (uint64_t)n;
    bytes -= (size_t)n;
  }
  return 0;
}

/* The others' buffer addresses; also a barrier (every rank has reached this collective). */
static uint64_t *peer_addrs(const void *data) {
  static uint64_t *addrs;
  static int n;
  if (n != local_size) {
    free(addrs);
    addrs = calloc((size_t)local_size, sizeof *addrs);
    n = addrs ? local_size : 0;
    if (!addrs) return NULL;
  }
  uint64_t mine = (uint64_t)(uintptr_t)data;
  MPI_Allgather(&mine, 1, MPI_UINT64_T, addrs, 1, MPI_UINT64_T, node);
  return addrs;
}

enum { CMA_BLOCK = 1 << 18 };   /* bytes a read into the cache-sized buffer the sum reads back */

/* Direct reads: every rank's gradients are final at the first collective, and each rank
   reads only the others' parts of its own slice, which they do not write; the last barrier
   keeps them from writing their gradients again until every rank has read them. */
static int cma_reduce_scatter(float *data, int64_t count, double *sum_sq) {
  uint64_t *addrs = peer_addrs(data);
  if (!addrs) {
    clrt_set_error("dist: out of memory");
    return -1;
  }
  int64_t lo, hi;
  dist_shm_slice(count, world_ranks, local_rank, &lo, &hi);
  size_t per = CMA_BLOCK / sizeof(float);
  long long blocks = (long long)(((size_t)(hi - lo) + per - 1) / per);
  double ss = 0;
  int failed = 0;
#pragma omp parallel reduction(+ : ss) reduction(| : failed) if (blocks > 1)
  {
    float *tmp = malloc(CMA_BLOCK);
    failed |= tmp == NULL;
#pragma omp for schedule(static)
    for (long long k = 0; k < blocks; k++) {
      if (failed) continue;
      size_t at = (size_t)lo + (size_t)k * per, m = (size_t)hi - at < per ? (size_t)hi - at : per;
      for (int q = 0, seen = 0; q < local_size && !failed; q++) {
        if (q == local_rank) continue;
        if (read_peer(q, tmp, addrs[q] + at * sizeof(float), m * sizeof(float))) failed = 1;
        else ss += add_into(data + at, tmp, m, ++seen == local_size - 1);
      }
    }
    free(tmp);
  }
  MPI_Barrier(node);
  if (failed) return -1;
  *sum_sq = ss;
  return 0;
}

/* Every rank's slice is final at the first collective; each reads the others' into its own
   buffer (they do not write those parts until the next step's update, after more barriers). */
static int cma_all_gather(float *data, int64_t count) {
  uint64_t *addrs = peer_addrs(data);
  if (!addrs) {
    clrt_set_error("dist: out of memory");
    return -1;
  }
  int failed = 0;
  for (int q = 0; q < local_size && !failed; q++) {
    if (q == local_rank) continue;
    int64_t lo, hi;
    dist_shm_slice(count, world_ranks, q, &lo, &hi);
    size_t per = BLOCK * 16 / sizeof(float);
    long long blocks = (long long)(((size_t)(hi - lo) + per - 1) / per);
#pragma omp parallel for schedule(static) reduction(| : failed) if (blocks > 1)
    for (long long k = 0; k < blocks; k++) {
      size_t at = (size_t)lo + (size_t)k * per, m = (size_t)hi - at < per ? (size_t)hi - at : per;
      if (read_peer(q, data + at, addrs[q] + at * sizeof(float), m * sizeof(float))) failed = 1;
    }
  }
  MPI_Barrier(node);
  return failed ? -1 : 0;
}

/* The most floats any rank of this machine owns of a buffer of count: the rounds to run. */
static int64_t largest_local_slice(int64_t count) {
  int64_t lo, hi, most = 0;
  for (int q = 0; q < local_size; q++) {
    dist_shm_slice(count, world_ranks, q, &lo, &hi);
    if (hi - lo > most) most = hi - lo;
  }
  return most;
}

/* Round j moves the j-th piece (sub floats) of every rank's slice: each rank stages the
   pieces the others own in its area (half j % 2), barrier, and each sums the staged copies of
   its own piece into its buffer. So every rank copies and sums alike in every round (no rank
   waits while another sums a round alone), and one barrier a round is enough: a half is
   written again two rounds later, after the barrier that follows everyone's reads of it. */
int dist_shm_reduce_scatter(float *data, int64_t count, double *sum_sq) {
  if (state == 0 && setup()) return -1;
  if (!sharded_ok()) return 1;
  if (cma) return cma_reduce_scatter(data, count, sum_sq);
  size_t sub = piece_floats();
  int64_t lo, hi, most = largest_local_slice(count);
  int64_t mlo, mhi;
  dist_shm_slice(count, world_ranks, local_rank, &mlo, &mhi);
  double ss = 0;
  node_sync();   /* nobody still reads an area from the collective before */
  for (int64_t j = 0; (size_t)j * sub < (size_t)most; j++) {
    float *stage = (float *)(void *)(area[local_rank] + (size_t)(j % 2) * half_bytes());
    for (int q = 0; q < local_size; q++) {
      if (q == local_rank) continue;
      dist_shm_slice(count, world_ranks, q, &lo, &hi);
      int64_t a = lo + j * (int64_t)sub, b = a + (int64_t)sub < hi ? a + (int64_t)sub : hi;
      if (b > a) copy((char *)(stage + (size_t)q * sub), (const char *)(data + a), (size_t)(b - a) * sizeof(float));
    }
    node_sync();
    int64_t a = mlo + j * (int64_t)sub, b = a + (int64_t)sub < mhi ? a + (int64_t)sub : mhi;
    if (b > a) {
      int others = local_size - 1, seen = 0;
      for (int q = 0; q < local_size; q++) {
        if (q == local_rank) continue;
        const float *src = (const float *)(const void *)(area[q] + (size_t)(j % 2) * half_bytes()) + (size_t)local_rank * sub;
        ss += add_into(data + a, src, (size_t)(b - a), ++seen == others);
      }
    }
  }
  node_sync();   /* the areas are free for whatever collective comes next */
  *sum_sq = ss;
  return 0;
}

/* Round j: each rank stages the j-th piece of its slice, barrier, each copies the others'. */
int dist_shm_all_gather(float *data, int64_t count) {
  if (state == 0 && setup()) return -1;
  if (!sharded_ok()) return 1;
  if (cma) return cma_all_gather(data, count);
  size_t sub = chunk / sizeof(float);
  int64_t lo, hi, most = largest_local_slice(count);
  int64_t mlo, mhi;
  dist_shm_slice(count, world_ranks, local_rank, &mlo, &mhi);
  node_sync();
  for (int64_t j = 0; (size_t)j * sub < (size_t)most; j++) {
    size_t half = (size_t)(j % 2) * half_bytes();
    int64_t a = mlo + j * (int64_t)sub, b = a + (int64_t)sub < mhi ? a + (int64_t)sub : mhi;
    if (b > a) copy(area[local_rank] + half, (const char *)(data + a), (size_t)(b - a) * sizeof(float));
    node_sync();
    for (int q = 0; q < local_size; q++) {
      if (q == local_rank) continue;
      dist_shm_slice(count, world_ranks, q, &lo, &hi);
      a = lo + j * (int64_t)sub;
      b = a + (int64_t)sub < hi ? a + (int64_t)sub : hi;
      if (b > a) copy((char *)(data + a), area[q] + half, (size_t)(b - a) * sizeof(float));
    }
  }
  node_sync();
  return 0;
}
#endif

void dist_shm_slice(int64_t count, int size, int rank, int64_t *lo, int64_t *hi) {
  enum { LINE = 16 };   /* f32 a cache line: a slice starts on its own line */
  int64_t per = (count + size - 1) / size;
  per = (per + LINE - 1) / LINE * LINE;
  int64_t a = (int64_t)rank * per;
  *lo = a < count ? a : count;
  *hi = *lo + per < count ? *lo + per : count;
}
