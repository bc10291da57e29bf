#pragma once

// PRAXIS_CHECK: a broken invariant of our own code crashes loudly (STYLE.md, Errors), naming the
// place and the condition; it is never a user error, which is an absl::Status instead.

#include <cstdio>
#include <cstdlib>

// Aborts with "FILE:LINE: check failed: COND: MESSAGE" when `cond` is false. `message` is a
// C string (a literal, or .c_str()); evaluated only on failure.
#define PRAXIS_CHECK(cond, message)                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, message); \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)
