/* terminal.c — line input with readline for interactive commands (clrt chat). Ctrl-C at the
   prompt clears the line instead of reaching the interpreter's interrupt handler. */
#include "clrt.h"

#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdlib.h>

static void clear_line(int sig) {
  (void)sig;
  rl_replace_line("", 0);
  rl_crlf();
  rl_on_new_line();
  rl_redisplay();
}

char *clrt_readline(const char *prompt) {
  struct sigaction mine, saved;
  mine.sa_handler = clear_line;
  sigemptyset(&mine.sa_mask);
  mine.sa_flags = 0;
  sigaction(SIGINT, &mine, &saved);
  char *line = readline(prompt);
  sigaction(SIGINT, &saved, NULL);
  if (line && *line) add_history(line);
  return line;
}

void clrt_free(void *p) { free(p); }

int clrt_history_load(const char *path) { return read_history(path); }

int clrt_history_save(const char *path) {
  int rc = write_history(path);
  history_truncate_file(path, 2000);
  return rc;
}
