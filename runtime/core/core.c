/* core.c — error messages, the interrupt flag, thread count, where the Lua files are. */
#include "clrt.h"

#include <limits.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

static _Thread_local char error_message[2048];
static volatile sig_atomic_t interrupt_flag;

const char *clrt_version(void) { return CLRT_VERSION; }

const char *clrt_last_error(void) { return error_message[0] ? error_message : "unknown error"; }

void clrt_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, ap);
  va_end(ap);
}

void clrt_clear_error(void) { error_message[0] = 0; }

int clrt_interrupted(void) { return interrupt_flag != 0; }
void clrt_set_interrupt(int on) { interrupt_flag = on ? 1 : 0; }

int clrt_num_threads(void) { return omp_get_max_threads(); }
void clrt_set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Order: $CLRT_LUA_DIR, the share dir beside the executable (installed), the source tree
   (running from a build directory). */
const char *clrt_lua_dir(void) {
  static char dir[PATH_MAX];
  if (dir[0]) return dir;
  const char *env = getenv("CLRT_LUA_DIR");
  if (env && is_dir(env)) {
    snprintf(dir, sizeof dir, "%s", env);
    return dir;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      char cand[PATH_MAX + 32];
      snprintf(cand, sizeof cand, "%s/../share/clrt/lua", exe);
      if (is_dir(cand) && realpath(cand, dir)) return dir;
    }
  }
  snprintf(dir, sizeof dir, "%s/lua", CLRT_SOURCE_DIR);
  return dir;
}
