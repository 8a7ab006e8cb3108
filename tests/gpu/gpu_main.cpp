// gpu_tests' own main: without a usable CUDA device the tests report that they did not run
// (exit 77, which CTest counts as skipped) instead of failing. This object defines doctest's
// implementation and main, so tests/common/main.cpp is never pulled out of the static library.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <flashattn/flashattn.h>

#include "gpu_harness.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  if (flashattn_cuda_device_count(&devices) != FLASHATTN_SUCCESS || devices == 0) {
    std::printf("no CUDA device: GPU tests not run (%s)\n",
                flashattn_has_cuda() ? "no driver or no device visible"
                                     : "this libflashattn was built without CUDA");
    return 77;
  }
  gpu_test::print_device_banner();
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  const int result = context.run();
  gpu_test::release_shared_context();
  return result;
}
