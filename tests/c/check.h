/* check.h — the assertions C tests share: on failure print where, expected and actual, and
   count it; the test's main returns check_summary() which prints "N passed, N failed". */
#ifndef CLRT_TEST_CHECK_H
#define CLRT_TEST_CHECK_H
#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (cond) check_passed++;                                                    \
    else {                                                                       \
      check_failed++;                                                            \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                            \
  } while (0)

#define CHECK_NEAR(actual, expected, tol)                                        \
  do {                                                                           \
    double a_ = (actual), e_ = (expected);                                       \
    if (fabs(a_ - e_) <= (tol) && a_ == a_) check_passed++;                      \
    else {                                                                       \
      check_failed++;                                                            \
      fprintf(stderr, "%s:%d: %s: expected %.9g, got %.9g (tol %g)\n", __FILE__, \
              __LINE__, #actual, e_, a_, (double)(tol));                         \
    }                                                                            \
  } while (0)

/* The runtime's last error must contain `needle`. */
#define CHECK_ERROR(needle)                                                      \
  do {                                                                           \
    const char *m_ = clrt_last_error();                                          \
    if (strstr(m_, needle)) check_passed++;                                      \
    else {                                                                       \
      check_failed++;                                                            \
      fprintf(stderr, "%s:%d: expected an error containing '%s', got '%s'\n",    \
              __FILE__, __LINE__, needle, m_);                                   \
    }                                                                            \
  } while (0)

static int check_summary(void) {
  printf("%d passed, %d failed\n", check_passed, check_failed);
  return check_failed ? 1 : 0;
}

#endif
