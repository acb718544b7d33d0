/* fuzz_extract_json.c — clrt.llm.extract_json (lua/clrt/net/llm_json.lua) on arbitrary replies:
   it must return a table or raise its own clear error, never anything else, never hang
   (libFuzzer's -timeout catches a hang). The Lua parser runs in an embedded LuaJIT state. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clrt.h"

static lua_State *L;

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  char code[4096];
  snprintf(code, sizeof code,
           "package.path = '%s/?.lua;' .. package.path\n"
           "return require('clrt.net.llm_json').extract_json",
           clrt_lua_dir());
  if (luaL_dostring(L, code)) {
    fprintf(stderr, "cannot load clrt.net.llm_json: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_setglobal(L, "extract_json");
}

/* LuaJIT's interpreter gives libFuzzer no coverage signal, so half the inputs are spelled
   in JSON-ish tokens (one byte picks one token) to reach deep into the parser anyway. */
static const char *const tokens[] = {
  "{", "}", "[", "]", "\"", "'", "'''", "\"\"\"", ":", ",", "\\", "\\u00e9", "\\ud83d", "true",
  "None", "NULL", "1", "-", ".", "e5", " ", "a", "\n", "\"8\"", "key", "{\"a\": ", "=", "```json\n",
  "+", "0.5", "\\\"", "}}", "{{",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) setup();
  lua_getglobal(L, "extract_json");
  if (size > 0 && (data[0] & 1)) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 1; i < size; i++) luaL_addstring(&b, tokens[data[i] % (sizeof tokens / sizeof *tokens)]);
    luaL_pushresult(&b);
  } else {
    lua_pushlstring(L, (const char *)data, size);
  }
  if (lua_pcall(L, 1, 1, 0) == 0) {
    if (!lua_istable(L, -1)) {
      fprintf(stderr, "extract_json returned a %s\n", luaL_typename(L, -1));
      abort();
    }
  } else {
    const char *msg = lua_tostring(L, -1);
    if (!msg || !strstr(msg, "clrt.llm.extract_json: ")) {
      fprintf(stderr, "extract_json raised an unexpected error: %s\n", msg ? msg : "(not a string)");
      abort();
    }
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
