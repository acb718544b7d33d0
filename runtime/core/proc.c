/* proc.c — child processes a scheduler can wait on: started without a shell (posix_spawn,
   so a trainer holding gigabytes does not copy its page tables for every program), each in
   its own session so that one signal reaches its whole process group, reaped without
   blocking, and waited on through a pidfd that poll() (and curl's event loop) can watch
   beside the sockets. The child gets exactly the descriptors asked for: 0, 1 and 2 on
   /dev/null unless given, everything else of this process closed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "clrt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_CHILD_FD = 63 };

static int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : (int)fd;
#else
  (void)pid;
  return -1;   /* callers fall back to polling waitpid on a short period */
#endif
}

static int add_redirects(posix_spawn_file_actions_t *fa, const clrt_proc_redirect *r, int n) {
  int given[MAX_CHILD_FD + 1] = {0};
  int top = 2;
  for (int i = 0; i < n; i++) {
    if (r[i].fd < 0 || r[i].fd > MAX_CHILD_FD) {
      clrt_set_error("proc: child descriptor %d is outside 0..%d", r[i].fd, MAX_CHILD_FD);
      return -1;
    }
    if (!r[i].path && (r[i].same_as < 0 || r[i].same_as > MAX_CHILD_FD || !given[r[i].same_as])) {
      clrt_set_error("proc: child descriptor %d copies %d, which is not set before it", r[i].fd, r[i].same_as);
      return -1;
    }
    given[r[i].fd] = 1;
    if (r[i].fd > top) top = r[i].fd;
  }
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (r[i].path) {
      int flags = r[i].write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
      rc = posix_spawn_file_actions_addopen(fa, r[i].fd, r[i].path, flags, 0600);
    } else {
      rc = posix_spawn_file_actions_adddup2(fa, r[i].same_as, r[i].fd);
    }
  }
  for (int fd = 0; fd <= top && rc == 0; fd++)
    if (!given[fd]) rc = posix_spawn_file_actions_addopen(fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(fa, top + 1);
  if (rc != 0) {
    clrt_set_error("proc: cannot prepare the child's descriptors: %s", strerror(rc));
    return -1;
  }
  return 0;
}

int clrt_proc_spawn(const char *const *argv, const char *const *envp, const char *cwd,
                    const clrt_proc_redirect *redirects, int n_redirects, clrt_proc *out) {
  if (!argv || !argv[0] || !envp || !out || n_redirects < 0) {
    clrt_set_error("proc: spawn needs argv (with a program), envp and an output");
    return -1;
  }
  memset(out, 0, sizeof *out);
  out->pid = -1;
  out->pidfd = -1;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&fa) != 0) {
    clrt_set_error("proc: out of memory");
    return -1;
  }
  if (posix_spawnattr_init(&attr) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    clrt_set_error("proc: out of memory");
    return -1;
  }
  int rc = add_redirects(&fa, redirects, n_redirects);
  if (rc == 0 && cwd && posix_spawn_file_actions_addchdir_np(&fa, cwd) != 0) {
    clrt_set_error("proc: cannot prepare the child's folder %s", cwd);
    rc = -1;
  }
  if (rc == 0) {
    /* The trainer's handlers (Ctrl-C) and blocked signals are not the child's business. */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], &fa, &attr, (char *const *)argv, (char *const *)envp);
    if (err != 0) {
      clrt_set_error("proc: cannot start %s: %s", argv[0], strerror(err));
      rc = -1;
    } else {
      out->pid = pid;
      out->pidfd = open_pidfd(pid);
    }
  }
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  return rc;
}

static void record(clrt_proc *p, int status) {
  p->done = 1;
  if (WIFEXITED(status)) p->exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) p->term_signal = WTERMSIG(status);
  if (p->pidfd >= 0) close(p->pidfd);
  p->pidfd = -1;
}

int clrt_proc_poll(clrt_proc *p, int block) {
  if (!p || p->pid <= 0) {
    clrt_set_error("proc: poll needs a started process");
    return -1;
  }
  if (p->done) return 1;
  for (;;) {
    int status;
    pid_t r = waitpid(p->pid, &status, block ? 0 : WNOHANG);
    if (r == p->pid) {
      record(p, status);
      return 1;
    }
    if (r == 0) return 0;
    if (errno == EINTR) continue;
    clrt_set_error("proc: waiting for process %d: %s", (int)p->pid, strerror(errno));
    return -1;
  }
}

int clrt_proc_kill(clrt_proc *p, int sig) {
  if (!p || p->pid <= 0) {
    clrt_set_error("proc: kill needs a started process");
    return -1;
  }
  if (p->done) return 0;   /* reaped: its pid may belong to someone else now */
  /* The whole group (the child made its own session); the child alone if the group is gone. */
  if (kill(-p->pid, sig) != 0 && kill(p->pid, sig) != 0 && errno != ESRCH) {
    clrt_set_error("proc: cannot signal process %d: %s", (int)p->pid, strerror(errno));
    return -1;
  }
  return 0;
}

int clrt_proc_wait_fds(const int *fds, int n, int timeout_ms) {
  enum { MAX_FDS = 1024 };
  struct pollfd pfd[MAX_FDS];
  if (n < 0 || n > MAX_FDS) {
    clrt_set_error("proc: can wait on 0..%d descriptors, got %d", MAX_FDS, n);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    pfd[i].fd = fds[i];
    pfd[i].events = POLLIN;
    pfd[i].revents = 0;
  }
  int r = poll(pfd, (nfds_t)n, timeout_ms);
  if (r < 0 && errno != EINTR) {
    clrt_set_error("proc: poll failed: %s", strerror(errno));
    return -1;
  }
  return r < 0 ? 0 : r;
}

int clrt_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int clrt_effective_uid(void) { return (int)geteuid(); }
