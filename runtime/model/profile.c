/* profile.c — per-kernel timing of the model's steps (CLRT_PROFILE=1): wall time per kind of
   kernel, summed over calls, read through clrt_profile_*. */
#include "model_internal.h"

#include <string.h>
#include <time.h>

double clrt_kernel_seconds[CLRT_K_COUNT];
const char *const clrt_kernel_names[CLRT_K_COUNT] = {
    "embedding", "linear fwd", "linear bwd", "rmsnorm", "rope", "attention fwd",
    "attention bwd", "swiglu", "residual", "output fwd", "output bwd", "adamw", "other", "lora"};
int model_prof_on = -1;
int (*model_prof_sync)(void);
int model_prof_syncing;

double model_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int clrt_profile_count(void) { return CLRT_K_COUNT; }
const char *clrt_profile_name(int i) { return i >= 0 && i < CLRT_K_COUNT ? clrt_kernel_names[i] : NULL; }
double clrt_profile_seconds(int i) { return i >= 0 && i < CLRT_K_COUNT ? clrt_kernel_seconds[i] : 0; }
void clrt_profile_reset(void) { memset(clrt_kernel_seconds, 0, sizeof clrt_kernel_seconds); }
void clrt_profile_enable(int on) { model_prof_on = on != 0; }
void clrt_profile_sync(int on) { model_prof_syncing = on != 0; }
