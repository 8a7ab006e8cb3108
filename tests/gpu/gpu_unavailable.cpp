// gpu_tests of a CPU-only build: nothing to run, and CTest should say so (exit 77 = skipped).
#include <cstdio>

int main() {
  std::puts("this libflashattn was built without CUDA: GPU tests not run");
  return 77;
}
