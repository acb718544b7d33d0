/* dist_shm.h — the all-reduce of host buffers through shared memory among the ranks of one
   machine (net/dist_shm.c); dist.c's only door to it. */
#ifndef CLRT_DIST_SHM_H
#define CLRT_DIST_SHM_H

#include <stdint.h>

/* Collective over MPI_COMM_WORLD, like MPI_Allreduce. Returns 0 when done, 1 when this job's
   layout does not suit it (one rank per machine, machines with unequal rank counts, or
   CLRT_DIST_SHM=0: the caller falls back to MPI_Allreduce; every rank gets the same answer),
   -1 with the error set. esz is 4 (f32) or 8 (f64); op is CLRT_DIST_SUM/MAX/MIN. */
int dist_shm_all_reduce(void *data, int64_t count, int esz, int op);
/* The sharded optimizer's halves of an all-reduce of count f32 (clrt_dist_reduce_scatter and
   clrt_dist_all_gather, slices by clrt_dist_slice): same returns; 1 also when the ranks are
   on several machines. */
int dist_shm_reduce_scatter(float *data, int64_t count, double *sum_sq);
int dist_shm_all_gather(float *data, int64_t count);
void dist_shm_finalize(void);
/* Rank rank's slice [lo, hi) of count f32 among size ranks (clrt_dist_slice's rule, which
   the window's steps share): contiguous, in rank order, each starting on a cache line. */
void dist_shm_slice(int64_t count, int size, int rank, int64_t *lo, int64_t *hi);

#endif
