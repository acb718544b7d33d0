/* files.c — the file-system steps a run folder needs, without a shell: a shell step runs
   through system(), which ignores SIGINT in the caller, so Ctrl-C during it was lost; and
   `mv a b; mv c a` is two steps with a gap. Each function here is one system call or a
   loop of them, checks every result and names the path in its error. */
#define _XOPEN_SOURCE 700
#include "clrt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int clrt_path_kind(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  return S_ISDIR(st.st_mode) ? 2 : 1;
}

int clrt_mkdir_p(const char *path) {
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p) {
    clrt_set_error("mkdir %s: out of memory", path);
    return -1;
  }
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      clrt_set_error("cannot create folder %s: %s", p, strerror(errno));
      free(p);
      return -1;
    }
    p[i] = c;
  }
  free(p);
  if (clrt_path_kind(path) != 2) {
    clrt_set_error("cannot create folder %s: a file of that name exists", path);
    return -1;
  }
  return 0;
}

int clrt_fsync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    clrt_set_error("cannot open %s to sync it: %s", path, strerror(errno));
    return -1;
  }
  /* folders on some file systems refuse fsync (EINVAL): nothing to make durable there */
  if (fsync(fd) != 0 && errno != EINVAL) {
    clrt_set_error("cannot sync %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  close(fd);
  return 0;
}

/* The folder holding path (".", or the text before the last '/'), synced so that a rename
   or a new entry in it survives a crash. */
static int sync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return clrt_fsync_path(".");
  if (slash == path) return clrt_fsync_path("/");
  size_t n = (size_t)(slash - path);
  char *dir = malloc(n + 1);
  if (!dir) return -1;
  memcpy(dir, path, n);
  dir[n] = 0;
  int rc = clrt_fsync_path(dir);
  free(dir);
  return rc;
}

int clrt_rename(const char *from, const char *to) {
  if (rename(from, to) != 0) {
    clrt_set_error("cannot rename %s to %s: %s", from, to, strerror(errno));
    return -1;
  }
  return sync_parent(to);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  int rc = (flag == FTW_DP) ? rmdir(path) : unlink(path);
  if (rc != 0 && errno != ENOENT) {
    clrt_set_error("cannot remove %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int clrt_remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : (clrt_set_error("cannot remove %s: %s", path, strerror(errno)), -1);
  if (!S_ISDIR(st.st_mode)) return remove_entry(path, &st, FTW_F, NULL);
  /* FTW_PHYS: a symbolic link is removed, never followed */
  return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

/* Whole-buffer write(2) loop: a short write continues, EINTR retries, anything else fails. */
static int write_all(int fd, const char *data, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t got = write(fd, data + off, len - off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = ENOSPC;
      return -1;
    }
    off += (size_t)got;
  }
  return 0;
}

int clrt_file_append(const char *path, const char *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    clrt_set_error("cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (write_all(fd, data, len) != 0) {
    clrt_set_error("cannot write %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (close(fd) != 0) {
    clrt_set_error("cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int clrt_file_write_parts_atomic(const char *path, int n, const void *const *parts,
                                 const size_t *lens) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  if (!tmp) {
    clrt_set_error("%s: out of memory", path);
    return -1;
  }
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    clrt_set_error("cannot create %s: %s", tmp, strerror(errno));
    free(tmp);
    return -1;
  }
  int bad = 0;
  for (int i = 0; i < n && !bad; i++) bad = write_all(fd, parts[i], lens[i]) != 0;
  if (!bad) bad = fsync(fd) != 0;
  int saved = errno;
  if (close(fd) != 0 && !bad) {
    bad = 1;
    saved = errno;
  }
  if (bad) {
    clrt_set_error("cannot write %s: %s", tmp, strerror(saved));
    unlink(tmp);
    free(tmp);
    return -1;
  }
  if (rename(tmp, path) != 0) {
    clrt_set_error("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    free(tmp);
    return -1;
  }
  free(tmp);
  return 0;
}

int clrt_file_write_atomic(const char *path, const char *data, size_t len) {
  const void *parts[1] = { data };
  return clrt_file_write_parts_atomic(path, 1, parts, &len);
}

int clrt_file_copy(const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    clrt_set_error("cannot open %s: %s", from, strerror(errno));
    return -1;
  }
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    clrt_set_error("cannot create %s: %s", to, strerror(errno));
    close(in);
    return -1;
  }
  char buf[1 << 16];
  int rc = 0;
  for (;;) {
    ssize_t got = read(in, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      clrt_set_error("cannot read %s: %s", from, strerror(errno));
      rc = -1;
      break;
    }
    if (got == 0) break;
    if (write_all(out, buf, (size_t)got) != 0) {
      clrt_set_error("cannot write %s: %s", to, strerror(errno));
      rc = -1;
      break;
    }
  }
  if (rc == 0 && fsync(out) != 0) {
    clrt_set_error("cannot sync %s: %s", to, strerror(errno));
    rc = -1;
  }
  close(in);
  if (close(out) != 0 && rc == 0) {
    clrt_set_error("cannot write %s: %s", to, strerror(errno));
    rc = -1;
  }
  return rc;
}

/* Names in a folder, each followed by '\n' (without "." and ".."), in a malloc'd buffer the
   caller frees with clrt_free_string; NULL with an error when the folder cannot be read. */
char *clrt_list_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    clrt_set_error("cannot read folder %s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 256, len = 0;
  char *out = malloc(cap);
  if (!out) {
    closedir(d);
    return NULL;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t n = strlen(e->d_name);
    if (len + n + 2 > cap) {
      while (len + n + 2 > cap) cap *= 2;
      char *grown = realloc(out, cap);
      if (!grown) {
        free(out);
        closedir(d);
        clrt_set_error("cannot read folder %s: out of memory", path);
        return NULL;
      }
      out = grown;
    }
    memcpy(out + len, e->d_name, n);
    len += n;
    out[len++] = '\n';
  }
  out[len] = 0;
  closedir(d);
  return out;
}

void clrt_free_string(char *s) { free(s); }

char *clrt_read_link(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return NULL;
  size_t cap = (size_t)st.st_size + 1 > 256 ? (size_t)st.st_size + 1 : 256;
  char *out = malloc(cap);
  if (!out) return NULL;
  ssize_t n = readlink(path, out, cap - 1);
  if (n < 0) {
    free(out);
    return NULL;
  }
  out[n] = 0;
  return out;
}

char *clrt_temp_dir(const char *prefix) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  size_t n = strlen(base) + strlen(prefix) + 16;
  char *out = malloc(n);
  if (!out) {
    clrt_set_error("cannot create a temporary folder: out of memory");
    return NULL;
  }
  snprintf(out, n, "%s/%s.XXXXXX", base, prefix);
  if (!mkdtemp(out)) {
    clrt_set_error("cannot create a temporary folder %s: %s", out, strerror(errno));
    free(out);
    return NULL;
  }
  return out;
}
