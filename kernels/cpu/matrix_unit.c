/* matrix_unit.c — which unit multiplies bf16 here, chosen at run time: AMX tiles
   (AMX-TILE + AMX-BF16, after Linux grants this process the tile data state), else
   AVX512-BF16 (vdpbf16ps), else AVX2's FMA units computing vdpbf16ps's sums (fma-bf16:
   bf16 numerics without bf16 hardware; on aarch64 NEON's FMAs, panels_neon.c), else none (the callers then multiply in f32). The
   CPU level (cpu_level.c, CLRT_CPU) bounds it: a Zen 5 capped to avx2 gets fma-bf16.
   CLRT_MATRIX_UNIT=f32|fma-bf16|avx512-bf16|amx-bf16 caps the choice (a test compares every unit the CPU
   has; a user can rule a unit out), and clrt_matrix_unit_cap does the same from code.
   The choice never depends on how many rows a product has: the same row gives the same bits
   in a decode step of 1 row and a prefill of 512. */
#include "model_kernels.h"
#include "simd512.h"

#include <stdlib.h>
#include <string.h>

#if CLRT_AVX512
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux keeps AMX's 8 KiB of tile data out of a process's saved state until it asks
   (arch/x86/include/uapi/asm/prctl.h: ARCH_REQ_XCOMP_PERM; XFEATURE_XTILEDATA is state 18);
   without the grant the first tile instruction faults. */
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static int cpu_has_amx_bf16(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  if (!tile || !bf16) return 0;
  /* the OS enables the tile state in XCR0 (bits 17 and 18) */
  if (!((c = 0, __get_cpuid(1, &a, &b, &c, &d)) && (c >> 27) & 1)) return 0;   /* OSXSAVE */
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return 0;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

static int cap_from_env(void) {
  const char *s = getenv("CLRT_MATRIX_UNIT");
  if (!s || !*s) return CLRT_UNIT_AMX;
  if (!strcmp(s, "f32")) return CLRT_UNIT_F32;
  if (!strcmp(s, "fma-bf16")) return CLRT_UNIT_FMA_BF16;
  if (!strcmp(s, "avx512bf16") || !strcmp(s, "avx512-bf16")) return CLRT_UNIT_AVX512BF16;
  return CLRT_UNIT_AMX;
}

static int cap = -1;

void clrt_matrix_unit_cap(int unit) { cap = unit; }

int clrt_matrix_unit_best(void) {
#if CLRT_AVX512
  static int amx = -1;   /* asked of the OS once: the grant is for the process */
  if (clrt_have_avx512bf16() && amx < 0) amx = cpu_has_amx_bf16();
  return clrt_have_avx512bf16() && amx > 0 ? CLRT_UNIT_AMX
         : clrt_have_avx512bf16()          ? CLRT_UNIT_AVX512BF16
         : clrt_have_avx2()                ? CLRT_UNIT_FMA_BF16
                                           : CLRT_UNIT_F32;
#else
  return clrt_have_neon() ? CLRT_UNIT_FMA_BF16 : CLRT_UNIT_F32;   /* aarch64: NEON's FMAs */
#endif
}

int clrt_matrix_unit(void) {
  if (cap < 0) cap = cap_from_env();
  int best = clrt_matrix_unit_best();
  return best < cap ? best : cap;
}

const char *clrt_matrix_unit_name(int unit) {
  return unit == CLRT_UNIT_AMX           ? "amx-bf16"
         : unit == CLRT_UNIT_AVX512BF16  ? "avx512-bf16"
         : unit == CLRT_UNIT_FMA_BF16    ? "fma-bf16"
                                         : "f32";
}
