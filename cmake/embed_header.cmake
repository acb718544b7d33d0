# Turns runtime/clrt.h into a C string so the binary can hand its own header to the Lua FFI.
file(READ ${IN} text)
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n\"" text "${text}")
file(WRITE ${OUT} "/* generated from runtime/clrt.h by cmake/embed_header.cmake */\nconst char *clrt_ffi_header(void);\nconst char *clrt_ffi_header(void) { return \"${text}\"; }\n")
