// The host checks' failure counter (tests/host/*.cu): CHECK prints the first ten failures and
// counts all; main() reports "all checks passed" only with none.
#pragma once
#include <cstdio>

static int failures = 0;
#define CHECK(cond, ...)                           \
  do {                                             \
    if (!(cond)) {                                 \
      if (failures < 10) std::printf(__VA_ARGS__); \
      ++failures;                                  \
    }                                              \
  } while (0)

// main()'s verdict: "all checks passed" (what tests/test_host_layout.py looks for) and 0, or the
// number of failed checks and 1.
inline int report(const char* what = "") {
  if (failures) {
    std::printf("%s%d checks failed\n", what, failures);
    return 1;
  }
  std::printf("%sall checks passed\n", what);
  return 0;
}
