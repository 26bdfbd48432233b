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
