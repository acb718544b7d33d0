/* cpu_level.h — the kernel families, ordered: a level runs every kernel of the levels below
   it (cpu_level.c picks one per process). */
#ifndef CLRT_CPU_LEVEL_H
#define CLRT_CPU_LEVEL_H

enum { CLRT_CPU_PORTABLE = 0, CLRT_CPU_AVX2 = 1, CLRT_CPU_AVXVNNI = 2, CLRT_CPU_AVX512 = 3 };

int clrt_cpu_level(void);        /* the level in use: the CPU's best, capped */
int clrt_cpu_level_best(void);   /* what the CPU has */
void clrt_cpu_level_cap(int level);
int clrt_cpu_level_by_name(const char *name);   /* -1 for an unknown name */
const char *clrt_cpu_level_name(int level);
int clrt_cpu_has_avxvnni(void);

#endif
