/* cpu_level.h — the kernel families, ordered: a level runs every kernel of the levels below
   it (cpu_level.c picks one per process). Each architecture has its own ladder, numbered
   from portable: x86-64 portable < avx2 < avxvnni < avx512, aarch64 portable < neon (so
   CLRT_CPU_NEON and CLRT_CPU_AVX2 share a number: the first vector level, CLRT_CPU_SIMD). */
#ifndef CLRT_CPU_LEVEL_H
#define CLRT_CPU_LEVEL_H

enum { CLRT_CPU_PORTABLE = 0, CLRT_CPU_AVX2 = 1, CLRT_CPU_AVXVNNI = 2, CLRT_CPU_AVX512 = 3 };
enum { CLRT_CPU_NEON = 1, CLRT_CPU_SIMD = 1 };

/* The top of this build's ladder. */
#if defined(__aarch64__)
enum { CLRT_CPU_TOP = CLRT_CPU_NEON };
#else
enum { CLRT_CPU_TOP = CLRT_CPU_AVX512 };
#endif

int clrt_cpu_level(void);        /* the level in use: the CPU's best, capped */
int clrt_cpu_level_best(void);   /* what the CPU has */
void clrt_cpu_level_cap(int level);
int clrt_cpu_level_by_name(const char *name);   /* -1 for an unknown name */
const char *clrt_cpu_level_name(int level);
int clrt_cpu_has_avxvnni(void);
int clrt_cpu_has_dotprod(void);   /* aarch64: the Armv8.2 dot product (SDOT/UDOT), HWCAP_ASIMDDP */

#endif
