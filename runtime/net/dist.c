/* dist.c — data parallelism across processes: MPI to start, to exchange and to agree; NCCL for
   the all-reduce of device buffers on CUDA builds (one GPU per rank, by local rank), the way
   llm.c does it. Built without MPI (or started without a launcher) the process is rank 0 of 1
   and every collective is a no-op, so a script runs the same with and without mpirun. */
#include "clrt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_shm.h"

#ifdef CLRT_HAVE_MPI
#include <mpi.h>
#endif
#ifdef CLRT_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_context.h"
#include "cuda/cuda_kernels.h"
#endif
#ifdef CLRT_HAVE_NCCL
#include <nccl.h>
#endif

static int dist_rank, dist_size = 1, dist_local_rank;

/* Launchers that start ranks set these; a plain `clrt x.lua` sets none and never touches MPI
   (a singleton MPI_Init is slow and, with some MPI builds, starts helper daemons). */
static int launched_by_mpi(void) {
  /* A program a rank starts (the tokenizer trainer, a warm start) inherits the launcher's
     variables but is no rank: it runs alone. */
  if (getenv("CLRT_DIST_CHILD")) return 0;
  static const char *vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                                "MPI_LOCALNRANKS", "CLRT_DIST" };
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

#ifdef CLRT_HAVE_MPI
static int dist_on;               /* MPI_Init_thread ran here */
#endif

int clrt_dist_available(void) {
#ifdef CLRT_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

#ifdef CLRT_HAVE_NCCL
static ncclComm_t nccl_comm;
static int nccl_ready;

/* The communicator on first use: rank 0's unique id broadcast over MPI. */
static int nccl_init(void) {
  if (nccl_ready) return 0;
  ncclUniqueId id;
  if (dist_rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    clrt_set_error("dist: ncclGetUniqueId failed");
    return -1;
  }
  MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclResult_t r = ncclCommInitRank(&nccl_comm, dist_size, id, dist_rank);
  if (r != ncclSuccess) {
    clrt_set_error("dist: ncclCommInitRank (rank %d of %d): %s", dist_rank, dist_size, ncclGetErrorString(r));
    return -1;
  }
  nccl_ready = 1;
  return 0;
}
#endif

int clrt_dist_init(void) {
#ifdef CLRT_HAVE_MPI
  if (dist_on || !launched_by_mpi()) return 0;
  int provided = 0;
  /* FUNNELED: only the main thread calls MPI; OpenMP's workers never do. */
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    clrt_set_error("dist: MPI_Init_thread failed");
    return -1;
  }
  dist_on = 1;
  setenv("CLRT_DIST_CHILD", "1", 1);
  MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &dist_size);
  /* The rank among those on this machine: the portable way, not a launcher's variable. */
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist_rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &dist_local_rank);
  MPI_Comm_free(&local);
#ifdef CLRT_HAVE_NCCL
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) cudaSetDevice(dist_local_rank % ndev);
#endif
#else
  /* Started as one of several ranks by a build that cannot talk to the others: N copies of
     the same run would write one run folder. */
  const char *n = getenv("OMPI_COMM_WORLD_SIZE");
  if (!n) n = getenv("PMI_SIZE");
  if (!getenv("CLRT_DIST_CHILD") && launched_by_mpi() && n && atoi(n) > 1) {
    clrt_set_error("started as one of %s ranks, but this clrt was built without MPI (CLRT_MPI off); "
                   "rebuild with MPI installed, or run one process", n);
    return -1;
  }
#endif
  return 0;
}

int clrt_dist_finalize(void) {
#ifdef CLRT_HAVE_MPI
  if (!dist_on) return 0;
#ifdef CLRT_HAVE_NCCL
  if (nccl_ready) ncclCommDestroy(nccl_comm);
  nccl_ready = 0;
#endif
  dist_shm_finalize();
  MPI_Finalize();
  dist_on = 0;
#endif
  return 0;
}

int clrt_dist_rank(void) { return dist_rank; }
int clrt_dist_size(void) { return dist_size; }
int clrt_dist_local_rank(void) { return dist_local_rank; }

void clrt_dist_abort(int code) {
#ifdef CLRT_HAVE_MPI
  if (dist_on) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  exit(code);
}

static size_t dtype_bytes(int dtype) {
  return dtype == CLRT_DIST_F64 ? 8 : dtype == CLRT_DIST_F32 ? 4 : dtype == CLRT_DIST_BYTES ? 1 : 0;
}

static int check_args(const void *data, int64_t count, int dtype, const char *what) {
  if (count < 0 || (count > 0 && !data) || !dtype_bytes(dtype)) {
    clrt_set_error("dist: %s: bad buffer (count %lld, dtype %d)", what, (long long)count, dtype);
    return -1;
  }
  return 0;
}

#ifdef CLRT_HAVE_MPI
static MPI_Datatype mpi_type(int dtype) {
  return dtype == CLRT_DIST_F64 ? MPI_DOUBLE : dtype == CLRT_DIST_F32 ? MPI_FLOAT : MPI_BYTE;
}
static MPI_Op mpi_op(int op) { return op == CLRT_DIST_MAX ? MPI_MAX : op == CLRT_DIST_MIN ? MPI_MIN : MPI_SUM; }
/* MPI counts are int: large buffers go in pieces. */
enum { CHUNK = 1 << 28 };
#endif

int clrt_dist_all_reduce(void *data, int64_t count, int dtype, int op, int device) {
  if (check_args(data, count, dtype, "all_reduce")) return -1;
  if (dtype == CLRT_DIST_BYTES || op < CLRT_DIST_SUM || op > CLRT_DIST_MIN) {
    clrt_set_error("dist: all_reduce: op %d over dtype %d is not supported (sum, max, min over f32, f64)", op, dtype);
    return -1;
  }
  if (dist_size == 1 || count == 0) return 0;
#ifdef CLRT_HAVE_MPI
  if (device == CLRT_CUDA) {
#ifdef CLRT_HAVE_NCCL
    if (nccl_init()) return -1;
    ncclRedOp_t nop = op == CLRT_DIST_MAX ? ncclMax : op == CLRT_DIST_MIN ? ncclMin : ncclSum;
    ncclDataType_t nt = dtype == CLRT_DIST_F64 ? ncclFloat64 : ncclFloat32;
    /* On clrt's stream: after the backward's kernels, before the optimizer's, no host wait
       between; the sync surfaces an error of either here. */
    ncclResult_t r = ncclAllReduce(data, data, (size_t)count, nt, nop, nccl_comm,
                                   (cudaStream_t)clrt_cuda_stream());
    if (r != ncclSuccess) {
      clrt_set_error("dist: ncclAllReduce (rank %d): %s", dist_rank, ncclGetErrorString(r));
      return -1;
    }
    return clrt_cuda_sync();
#else
    clrt_set_error("dist: all_reduce of device memory needs a build with NCCL");
    return -1;
#endif
  }
  size_t esz = dtype_bytes(dtype);
  /* ranks sharing a machine sum through shared memory (dist_shm.c); else MPI's own */
  int shm = dist_shm_all_reduce(data, count, (int)esz, op);
  if (shm <= 0) return shm;
  char *p = data;
  for (int64_t done = 0; done < count; done += CHUNK) {
    int n = (int)(count - done < CHUNK ? count - done : CHUNK);
    MPI_Allreduce(MPI_IN_PLACE, p + (size_t)done * esz, n, mpi_type(dtype), mpi_op(op), MPI_COMM_WORLD);
  }
  return 0;
#else
  (void)device;
  return 0;
#endif
}

int clrt_dist_broadcast(void *data, int64_t count, int dtype, int root) {
  if (check_args(data, count, dtype, "broadcast")) return -1;
  if (root < 0 || root >= dist_size) {
    clrt_set_error("dist: broadcast: root %d is not a rank (world size %d)", root, dist_size);
    return -1;
  }
  if (dist_size == 1 || count == 0) return 0;
#ifdef CLRT_HAVE_MPI
  char *p = data;
  size_t esz = dtype_bytes(dtype);
  for (int64_t done = 0; done < count; done += CHUNK) {
    int n = (int)(count - done < CHUNK ? count - done : CHUNK);
    MPI_Bcast(p + (size_t)done * esz, n, mpi_type(dtype), root, MPI_COMM_WORLD);
  }
#endif
  return 0;
}

void clrt_dist_slice(int64_t count, int rank, int64_t *lo, int64_t *hi) {
  dist_shm_slice(count, dist_size, rank, lo, hi);
}

static double sum_squares(const float *x, int64_t n) {
  double ss = 0;
#pragma omp parallel for schedule(static) reduction(+ : ss) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  return ss;
}

#ifdef CLRT_HAVE_MPI
/* Between machines, slice by slice in CHUNK pieces, one owner after another: sum = 1 sums
   each slice at its owner (MPI_Reduce), sum = 0 sends each owner's slice to all (MPI_Bcast). */
static void by_owner_over_mpi(float *data, int64_t count, int sum) {
  for (int q = 0; q < dist_size; q++) {
    int64_t qlo, qhi;
    clrt_dist_slice(count, q, &qlo, &qhi);
    for (int64_t at = qlo; at < qhi; at += CHUNK) {
      int n = (int)(qhi - at < CHUNK ? qhi - at : CHUNK);
      if (!sum) MPI_Bcast(data + at, n, MPI_FLOAT, q, MPI_COMM_WORLD);
      else if (q == dist_rank) MPI_Reduce(MPI_IN_PLACE, data + at, n, MPI_FLOAT, MPI_SUM, q, MPI_COMM_WORLD);
      else MPI_Reduce(data + at, NULL, n, MPI_FLOAT, MPI_SUM, q, MPI_COMM_WORLD);
    }
  }
}
#endif

int clrt_dist_reduce_scatter(float *data, int64_t count, double *sum_sq) {
  if (check_args(data, count, CLRT_DIST_F32, "reduce_scatter") || !sum_sq) return -1;
  int64_t lo, hi;
  clrt_dist_slice(count, dist_rank, &lo, &hi);
#ifdef CLRT_HAVE_MPI
  if (dist_size > 1 && count > 0) {
    int shm = dist_shm_reduce_scatter(data, count, sum_sq);
    if (shm <= 0) return shm;
    by_owner_over_mpi(data, count, 1);
  }
#endif
  *sum_sq = sum_squares(data + lo, hi - lo);
  return 0;
}

int clrt_dist_all_gather(float *data, int64_t count) {
  if (check_args(data, count, CLRT_DIST_F32, "all_gather")) return -1;
  if (dist_size == 1 || count == 0) return 0;
#ifdef CLRT_HAVE_MPI
  int shm = dist_shm_all_gather(data, count);
  if (shm <= 0) return shm;
  by_owner_over_mpi(data, count, 0);
#endif
  return 0;
}

int clrt_dist_barrier(void) {
#ifdef CLRT_HAVE_MPI
  if (dist_on) MPI_Barrier(MPI_COMM_WORLD);
#endif
  return 0;
}

/* FNV-1a over 64-bit words (then the tail bytes): equal parameters give equal sums, and any
   differing bit almost surely changes it. Device memory is read through the host in pieces. */
static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

uint64_t clrt_dist_checksum(const void *data, size_t bytes, int device) {
  uint64_t h = 0xcbf29ce484222325ULL;
  if (device != CLRT_CUDA) return fnv(h, data, bytes);
#ifdef CLRT_HAVE_CUDA
  enum { PIECE = 1 << 24 };
  unsigned char *buf = malloc(PIECE);
  if (!buf) return 0;
  for (size_t done = 0; done < bytes; done += PIECE) {
    size_t n = bytes - done < PIECE ? bytes - done : PIECE;
    /* on clrt's stream, which the parameters' last writes used; it waits for them */
    if (clrt_cuda_memcpy(buf, (const char *)data + done, n, 1)) break;
    h = fnv(h, buf, n);
  }
  free(buf);
#endif
  return h;
}
