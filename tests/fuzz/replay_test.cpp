// Replays the fuzzer's seed corpus and every regression input through the harness, in every
// build (the plain one, and under ASan + UBSan in scripts/steps/30-sanitize.sh), so an input that
// once crashed the library keeps being run even where libFuzzer is not available.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      files.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  return files;
}

int replay_dir(const std::string& dir) {
  int n = 0;
  for (const std::string& path : files_in(dir)) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO("input " << path);
    // A violated invariant or a crash aborts the process; reaching the CHECK is the pass.
    CHECK(LLVMFuzzerTestOneInput(bytes.data(), bytes.size()) == 0);
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("fuzz: regression inputs replay cleanly") {
  const int n = replay_dir(FLASHATTN_FUZZ_REGRESSIONS_DIR);
  MESSAGE(n << " regression inputs replayed");
}

TEST_CASE("fuzz: seed corpus replays cleanly") {
  const int n = replay_dir(FLASHATTN_FUZZ_CORPUS_DIR);
  CHECK(n >= 24);  // the checked-in seeds exist
  MESSAGE(n << " seed inputs replayed");
}
