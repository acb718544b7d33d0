/* cpu_level.c — which family of kernels this process runs, decided once: the best level the
   CPU has (AVX-512 with its BF16/VNNI extensions, AVX-VNNI on AVX2, AVX2 + FMA, or portable C),
   capped by CLRT_CPU=avx512|avxvnni|avx2|portable or clrt_cpu_level_cap(); on aarch64 the
   ladder is portable < neon (Armv8 Advanced SIMD, always there; its extensions, such as the
   dot product, are asked of the kernel's HWCAP bits where a kernel uses them), capped by
   CLRT_CPU=neon|portable. A cap lets any
   machine run the kernels a smaller CPU would (a Zen 5 runs Zen 3's AVX2 paths), so CI tests
   every level it can execute; a cap above what the CPU has changes nothing. */
#include "cpu_level.h"

#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
static const char *const names[] = {"portable", "neon"};
#else
static const char *const names[] = {"portable", "avx2", "avxvnni", "avx512"};
#endif

static int detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (avx2 && avx512) return CLRT_CPU_AVX512;
  if (avx2 && clrt_cpu_has_avxvnni()) return CLRT_CPU_AVXVNNI;
  return avx2 ? CLRT_CPU_AVX2 : CLRT_CPU_PORTABLE;
#elif defined(__aarch64__)
  return CLRT_CPU_NEON;   /* Advanced SIMD is part of Armv8-A */
#else
  return CLRT_CPU_PORTABLE;
#endif
}

int clrt_cpu_level_by_name(const char *name) {
  for (int l = CLRT_CPU_PORTABLE; l <= CLRT_CPU_TOP; l++)
    if (name && !strcmp(name, names[l])) return l;
  return -1;
}

const char *clrt_cpu_level_name(int level) {
  return level >= CLRT_CPU_PORTABLE && level <= CLRT_CPU_TOP ? names[level] : "unknown";
}

int clrt_cpu_level_best(void) {
  static int best = -1;
  if (best < 0) best = detect();
  return best;
}

static int cap = -1;   /* -1: not read yet; the environment's cap, or clrt_cpu_level_cap's */

void clrt_cpu_level_cap(int level) { cap = level; }

int clrt_cpu_level(void) {
  if (cap < 0) {
    int named = clrt_cpu_level_by_name(getenv("CLRT_CPU"));
    cap = named >= 0 ? named : CLRT_CPU_TOP;
  }
  int best = clrt_cpu_level_best();
  return best < cap ? best : cap;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* CPUID.(EAX=7,ECX=1):EAX bit 4; GCC 12's __builtin_cpu_supports does not know "avxvnni". */
int clrt_cpu_has_avxvnni(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4) & 1;
}
#else
int clrt_cpu_has_avxvnni(void) { return 0; }
#endif

#if defined(__aarch64__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)   /* Linux arch/arm64/include/uapi/asm/hwcap.h */
#endif
int clrt_cpu_has_dotprod(void) {
  static int known = -1;
  if (known < 0) known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return known;
}
#else
int clrt_cpu_has_dotprod(void) { return 0; }
#endif
