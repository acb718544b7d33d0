/* main.c — the clrt command: runs a Lua script, a -e chunk, a subcommand, or the REPL.
   Everything a user sees (printing, completion candidates, chunk continuation) is decided in
   Lua (lua/clrt/cli/repl.lua); C owns only the terminal (readline) and the signals. */
#include "clrt.h"

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static lua_State *globalL;
static volatile sig_atomic_t evaluating;   /* a chunk is running: Ctrl-C interrupts it */
static volatile sig_atomic_t in_repl;      /* the REPL's readline owns the terminal */

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted");
}

/* How long a rank other than 0 of a data-parallel job waits after Ctrl-C before it stops on
   its own (seconds). Every rank gets the signal, but only rank 0 says how to resume: a rank
   that stopped first would end the job (MPI_Abort) while rank 0 may still wait in a
   collective for it, and rank 0's message would be lost. So the other ranks keep going (they
   reach the collective rank 0 waits in) and rank 0 ends the job; they stop by themselves only
   if it has not within this time. */
enum { FOLLOWER_GRACE_S = 10 };

static void on_sigint(int sig) {
  if (evaluating && sig != SIGALRM && clrt_dist_size() > 1 && clrt_dist_rank() != 0) {
    alarm(FOLLOWER_GRACE_S);   /* async-signal-safe; a second Ctrl-C restarts the wait */
    return;
  }
  if (evaluating) {
    clrt_set_interrupt(1);
    lua_sethook(globalL, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  } else if (!in_repl) {
    /* Between chunks outside the REPL (a script's error being reported, MPI_Abort ending the
       job): readline was never set up, so the signal does what it would without a handler. */
    signal(sig, SIG_DFL);
    raise(sig);
  } else {
    /* At the prompt: drop the line being typed and start a fresh one. */
    rl_replace_line("", 0);
    rl_crlf();
    rl_on_new_line();
    rl_redisplay();
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: clrt [options] [SCRIPT.lua [key=value ...]]\n"
          "       clrt COMMAND [args]      (chat, serve, ... from lua/clrt/cli/commands)\n"
          "  -e CODE        run CODE (clrt is preloaded as a global)\n"
          "  -v, --version  print the version\n"
          "  -h, --help     this help, then the commands and recipes\n"
          "With no script, clrt starts an interactive REPL (or runs stdin when it is not a\n"
          "terminal; '-' as the script reads stdin too).\n"
          "A script path that does not exist here is looked up under the installed Lua dir,\n"
          "so 'clrt recipes/collabllm_rl.lua' runs the shipped recipe.\n");
}

/* After the options, `clrt --help` lists the subcommands and recipes from their files' doc
   comments (lua/clrt/cli/help.lua), so the list follows what is installed. */
static int print_catalogue(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "clrt.cli.help");
  if (lua_pcall(L, 1, 1, 0)) return 1;
  lua_getfield(L, -1, "catalogue");
  int st = lua_pcall(L, 0, 0, 0);
  if (st) fprintf(stderr, "clrt: %s\n", lua_tostring(L, -1));
  return st;
}

/* An error raised with a position ("x.lua:12: ...", "(command line):1: ...") comes from code
   and gets a traceback; one raised without (error(msg, 0): a bad setting, a missing file, a
   refused key) is a message for the user and stays one line, unless CLRT_TRACEBACK=1. */
static int wants_traceback(const char *msg) {
  const char *t = getenv("CLRT_TRACEBACK");
  if (t && !strcmp(t, "1")) return 1;
  const char *colon = strstr(msg, ":");
  if (!colon || colon[1] < '0' || colon[1] > '9') return 0;
  size_t n = (size_t)(colon - msg);
  return (n > 4 && !strncmp(colon - 4, ".lua", 4)) || (n > 0 && msg[n - 1] == ')') ||
         (n > 0 && msg[n - 1] == ']');
}

/* Error handler: message plus traceback, as lua.c does (see wants_traceback). */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  if (!wants_traceback(msg)) {
    lua_pushstring(L, msg);
    return 1;
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int pcall_traceback(lua_State *L, int nargs, int nres) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  evaluating = 1;
  int st = lua_pcall(L, nargs, nres, base);
  evaluating = 0;
  clrt_set_interrupt(0);
  lua_sethook(L, NULL, 0, 0);
  lua_remove(L, base);
  return st;
}

/* With several ranks an error ends the whole job: the others may wait in an all-reduce that
   this rank will never join, so the message names the rank and MPI_Abort stops them all. */
static int report(lua_State *L, int st) {
  if (st && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    if (clrt_dist_size() > 1)
      fprintf(stderr, "clrt: rank %d of %d: %s\n", clrt_dist_rank(), clrt_dist_size(),
              msg ? msg : "(error object is not a string)");
    else
      fprintf(stderr, "clrt: %s\n", msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  if (st && clrt_dist_size() > 1) {
    fflush(stderr);
    clrt_dist_abort(1);
  }
  return st;
}

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int setup_state(lua_State *L, char **argv, int argc, int script_index) {
  luaL_openlibs(L);
  /* package.path: clrt's Lua dir first, then whatever LuaJIT had. */
  const char *dir = clrt_lua_dir();
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  /* arg: arg[0] is the script, arg[1..] its arguments, negative indices the interpreter. */
  lua_createtable(L, argc, 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script_index);
  }
  lua_setglobal(L, "arg");
  lua_getglobal(L, "require");
  lua_pushstring(L, "clrt");
  if (report(L, pcall_traceback(L, 1, 1))) return 1;
  lua_setglobal(L, "clrt");
  return 0;
}

/* path "-" (or NULL) reads the script from stdin. */
static int run_script(lua_State *L, const char *path, int nargs_start, int argc, char **argv) {
  char resolved[4096];
  if (path && !strcmp(path, "-")) path = NULL;
  if (path && !file_exists(path)) {
    snprintf(resolved, sizeof resolved, "%s/%s", clrt_lua_dir(), path);
    if (file_exists(resolved)) path = resolved;
  }
  /* Text only: LuaJIT trusts bytecode, and malformed bytecode can crash it. */
  int st = luaL_loadfilex(L, path, "t");
  if (st && lua_isstring(L, -1) && strstr(lua_tostring(L, -1), "wrong mode")) {
    lua_pop(L, 1);
    lua_pushfstring(L, "%s: precompiled bytecode is not accepted; run the Lua source",
                    path ? path : "stdin");
  }
  if (report(L, st)) return 1;
  int n = 0;
  for (int i = nargs_start; i < argc; i++, n++) lua_pushstring(L, argv[i]);
  st = pcall_traceback(L, n, 0);
  if (st && lua_isstring(L, -1) && strstr(lua_tostring(L, -1), "interrupted")) {
    /* Ctrl-C before the recipe's own guard: let Lua say how to resume (clrt.run). */
    lua_getglobal(L, "require");
    lua_pushstring(L, "clrt.run");
    if (lua_pcall(L, 1, 1, 0) == 0) {
      lua_getfield(L, -1, "interrupted_early");
      if (lua_isfunction(L, -1) && lua_pcall(L, 0, 0, 0)) lua_pop(L, 1);
      else if (!lua_isfunction(L, -1)) lua_pop(L, 1);
    }
    lua_pop(L, 1);   /* clrt.run or require's error */
  }
  return report(L, st);
}

/* ---- the REPL: readline in C, evaluation in lua/clrt/cli/repl.lua ---- */

static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1;   /* never fall back to file names */
  rl_completion_append_character = '\0';   /* `clrt.ten<TAB>` then `.ones` must not get a space */
  lua_State *L = globalL;
  int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "clrt.cli.repl");
  if (lua_pcall(L, 1, 1, 0)) goto none;
  lua_getfield(L, -1, "complete");
  lua_pushstring(L, text);
  lua_pushstring(L, rl_line_buffer);
  if (lua_pcall(L, 2, 1, 0) || !lua_istable(L, -1)) goto none;
  size_t n = lua_objlen(L, -1);
  if (n == 0) goto none;
  char **out = calloc(n + 2, sizeof *out);
  if (!out) goto none;
  /* out[0] is the common prefix readline inserts; the matches follow. */
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (int)i);
    out[i] = strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
    lua_pop(L, 1);
  }
  size_t common = strlen(out[1]);
  for (size_t i = 2; i <= n; i++) {
    size_t k = 0;
    while (k < common && out[i][k] == out[1][k]) k++;
    common = k;
  }
  out[0] = strndup(out[1], common);
  lua_settop(L, top);
  return out;
none:
  lua_settop(L, top);
  return NULL;
}

static void history_path(char *buf, size_t n) {
  const char *env = getenv("CLRT_HISTORY");
  const char *home = getenv("HOME");
  if (env)
    snprintf(buf, n, "%s", env);
  else
    snprintf(buf, n, "%s/.clrt_history", home ? home : ".");
}

static int repl(lua_State *L) {
  char hist[4096];
  history_path(hist, sizeof hist);
  read_history(hist);
  rl_readline_name = "clrt";
  rl_basic_word_break_characters = " \t\n\"'`@$><=;|&{(,+-*/%^#[]";
  rl_attempted_completion_function = complete;
  in_repl = 1;
  printf("clrt %s (LuaJIT) — Ctrl-D exits, Ctrl-C interrupts\n", clrt_version());
  lua_getglobal(L, "require");
  lua_pushstring(L, "clrt.cli.repl");
  if (report(L, pcall_traceback(L, 1, 1))) return 1;
  int repl_mod = lua_gettop(L);

  char *pending = NULL;   /* the chunk so far, while it is incomplete */
  for (;;) {
    char *line = readline(pending ? ">> " : "> ");
    if (!line) {   /* Ctrl-D */
      printf("\n");
      break;
    }
    if (*line) add_history(line);
    size_t a = pending ? strlen(pending) : 0, b = strlen(line);
    char *chunk = malloc(a + b + 2);
    if (!chunk) break;
    if (pending) {
      memcpy(chunk, pending, a);
      chunk[a++] = '\n';
    }
    memcpy(chunk + a, line, b + 1);
    free(line);
    free(pending);
    pending = NULL;

    lua_getfield(L, repl_mod, "eval");
    lua_pushstring(L, chunk);
    int st = pcall_traceback(L, 1, 1);
    if (st) {
      report(L, st);
      free(chunk);
      continue;
    }
    int incomplete = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (incomplete)
      pending = chunk;
    else
      free(chunk);
    fflush(stdout);
  }
  free(pending);
  write_history(hist);
  history_truncate_file(hist, 5000);
  return 0;
}

int main(int argc, char **argv) {
  int script_index = 0;   /* index in argv of the script (0: none) */
  const char *code = NULL;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      lua_State *L = luaL_newstate();
      if (!L) return 0;
      int rc = setup_state(L, argv, argc, 0) || print_catalogue(L);
      lua_close(L);
      return rc;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--version")) {
      printf("clrt %s (%s)\ncpu: %s\n", clrt_version(), LUAJIT_VERSION, clrt_cpu_paths());
      return 0;
    } else if (!strcmp(a, "-e")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "clrt: -e needs an argument\n");
        return 2;
      }
      code = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "clrt: unknown option '%s' (see clrt --help)\n", a);
      return 2;
    } else {
      script_index = i;
      break;
    }
  }

  if (clrt_dist_init()) {
    fprintf(stderr, "clrt: %s\n", clrt_last_error());
    return 1;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "clrt: cannot create the Lua state (out of memory)\n");
    return 1;
  }
  globalL = L;
  signal(SIGINT, on_sigint);
  /* mpirun turns Ctrl-C into SIGTERM to every rank: stop as Ctrl-C does, saying how to resume.
     CLRT_SIGTERM=interrupt asks the same of a process started by a run (the asynchronous RL
     worker, clrt.train.async), so that a stop bills the API calls of the step it cuts short;
     elsewhere SIGTERM ends the process at once, as a supervisor expects. */
  const char *term = getenv("CLRT_SIGTERM");
  if (clrt_dist_size() > 1 || (term && !strcmp(term, "interrupt"))) {
    signal(SIGTERM, on_sigint);
    signal(SIGALRM, on_sigint);   /* a follower rank's grace ran out */
  }
  int rc = 0;
  if (setup_state(L, argv, argc, script_index ? script_index : (code ? i : 0))) {
    rc = 1;
  } else if (code) {
    rc = report(L, luaL_loadbufferx(L, code, strlen(code), "=(command line)", "t")) ||
         report(L, pcall_traceback(L, 0, 0));
    if (!rc && script_index) rc = run_script(L, argv[script_index], script_index + 1, argc, argv);
  } else if (script_index) {
    const char *s = argv[script_index];
    size_t n = strlen(s);
    char cmd[4096];
    /* A bare word that names lua/clrt/cli/commands/<word>.lua is a subcommand. */
    snprintf(cmd, sizeof cmd, "%s/clrt/cli/commands/%s.lua", clrt_lua_dir(), s);
    if (!(n > 4 && !strcmp(s + n - 4, ".lua")) && !strchr(s, '/') && !file_exists(s) &&
        file_exists(cmd))
      rc = run_script(L, cmd, script_index + 1, argc, argv);
    else
      rc = run_script(L, s, script_index + 1, argc, argv);
  } else if (!isatty(STDIN_FILENO)) {   /* `echo 'print(1)' | clrt` runs it, as lua does */
    rc = run_script(L, NULL, argc, argc, argv);
  } else {
    rc = repl(L);
  }
  lua_close(L);
  clrt_dist_finalize();
  return rc ? 1 : 0;
}
