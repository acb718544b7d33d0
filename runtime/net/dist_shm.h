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
void dist_shm_finalize(void);

#endif
