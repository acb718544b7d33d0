/* cpu_paths.c — which CPU kernels this process runs, in one line for `clrt --version`, the
   benchmarks and bug reports: the kernel level (capped by CLRT_CPU) against what the CPU has,
   the unit bf16 products run on, and the int8 path. */
#include "model_internal.h"

#include "cpu/cpu_level.h"
#include "cpu/linear_int8.h"

#include <stdio.h>

int clrt_set_cpu_level(const char *name) {
  int level = clrt_cpu_level_by_name(name);
  if (level < 0) {
    clrt_set_error("cpu level '%s' (portable, avx2, avxvnni, avx512)", name ? name : "(null)");
    return -1;
  }
  clrt_cpu_level_cap(level);
  return 0;
}

const char *clrt_cpu_paths(void) {
  static char line[192];
  snprintf(line, sizeof line, "kernels %s (this CPU: %s; CLRT_CPU caps it), bf16 products %s, int8 %s",
           clrt_cpu_level_name(clrt_cpu_level()), clrt_cpu_level_name(clrt_cpu_level_best()),
           clrt_matrix_unit_name(clrt_matrix_unit()), clrt_int8_path_name(clrt_int8_path()));
  return line;
}
