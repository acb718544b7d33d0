/* test_proc.c — core/proc.c: a child gets exactly the descriptors and environment asked for,
   its end is seen through its pidfd without blocking, a kill reaches its whole group, and
   bad requests are errors that name what is wrong. */
#include "clrt.h"
#include "check.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *slurp(const char *path) {
  static char buf[4096];
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

int main(void) {
  char dir[] = "/tmp/clrt-test-proc.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char out[256], in[256], flag[256];
  snprintf(out, sizeof out, "%s/out", dir);
  snprintf(in, sizeof in, "%s/in", dir);
  snprintf(flag, sizeof flag, "%s/flag", dir);
  FILE *f = fopen(in, "w");
  fputs("from stdin\n", f);
  fclose(f);

  /* the environment is exactly envp; 0 reads the file, 1 and 2 share one file, 3 is closed
     in the child though open here */
  int stray = dup(1);
  char script[512];
  snprintf(script, sizeof script,
           "read line; echo \"$line|$ONLY|${HOME:-nohome}\"; echo err >&2; "
           "if (: >&%d) 2>/dev/null; then echo leaked; fi; exit 7", stray);
  const char *argv[] = {"sh", "-c", script, NULL};
  const char *envp[] = {"ONLY=1", "PATH=/usr/bin:/bin", NULL};
  clrt_proc_redirect red[] = {{0, in, 0, -1}, {1, out, 1, -1}, {2, NULL, 0, 1}};
  clrt_proc p;
  CHECK(clrt_proc_spawn(argv, envp, dir, red, 3, &p) == 0);
  CHECK(p.pid > 0);
  CHECK(p.pidfd >= 0);
  int fds[1] = {p.pidfd};
  CHECK(clrt_proc_wait_fds(fds, 1, 10000) == 1);   /* readable once it has ended */
  CHECK(clrt_proc_poll(&p, 0) == 1);
  CHECK(p.done == 1 && p.exit_code == 7 && p.term_signal == 0);
  char *text = slurp(out);
  CHECK(text && strcmp(text, "from stdin|1|nohome\nerr\n") == 0);
  if (text) printf("child wrote: %s", text);
  close(stray);

  /* a running child polls as running; a kill reaches the grandchild in its group */
  char group[512];
  snprintf(group, sizeof group, "(: > %s; sleep 300; :) & sleep 300", flag);
  const char *argv2[] = {"sh", "-c", group, NULL};
  CHECK(clrt_proc_spawn(argv2, envp, NULL, NULL, 0, &p) == 0);
  CHECK(clrt_proc_poll(&p, 0) == 0);
  for (int i = 0; i < 1000 && access(flag, F_OK) != 0; i++) usleep(10 * 1000);
  CHECK(access(flag, F_OK) == 0);   /* the grandchild runs */
  CHECK(clrt_proc_kill(&p, SIGKILL) == 0);
  CHECK(clrt_proc_poll(&p, 1) == 1);
  CHECK(p.term_signal == SIGKILL);
  CHECK(clrt_proc_kill(&p, SIGKILL) == 0);   /* reaped: nothing is signalled */
  int left = 1;
  for (int i = 0; i < 200 && left; i++) {
    left = kill(-p.pid, 0) == 0;   /* a process of the group is left */
    if (left) usleep(10 * 1000);
  }
  CHECK(!left);
  if (left) kill(-p.pid, SIGKILL);   /* a failing run leaves nothing either */

  /* errors name what is wrong */
  const char *missing[] = {"/nonexistent/program", NULL};
  CHECK(clrt_proc_spawn(missing, envp, NULL, NULL, 0, &p) != 0);
  CHECK_ERROR("cannot start /nonexistent/program");
  clrt_proc_redirect bad[] = {{2, NULL, 0, 5}};
  CHECK(clrt_proc_spawn(argv, envp, NULL, bad, 1, &p) != 0);
  CHECK_ERROR("copies 5, which is not set before it");
  CHECK(clrt_proc_spawn(NULL, envp, NULL, NULL, 0, &p) != 0);
  CHECK(clrt_cpu_count() >= 1);

  remove(out);
  remove(in);
  remove(flag);
  rmdir(dir);
  return check_summary();
}
