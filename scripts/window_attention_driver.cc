// Times cpu_kernels.cc's WindowAttention alone, outside MindSpore (docs/teacher_profile.md, "The softmax
// inside WindowAttention, vectorised"): the demo teacher's shapes (B 1, Hq 4, Hkv 2, D 64, S 2304, window
// 512), N causal query rows whose last row keeps slots [0, USED). Prints a checksum of the output bits and
// the median of 300 calls.
//
//   g++ -O3 -march=native -std=c++17 -ffp-contract=off -fno-trapping-math -Ieagle_ms/models \
//       scripts/window_attention_driver.cc eagle_ms/models/cpu_kernels.cc -o /tmp/wa && /tmp/wa N USED
//
// The flags are the kernel library's (eagle_ms/models/cpu_kernels.py FLAGS); -march=haswell instead of
// native builds the 8-lane form. For an older kernel, build against `git show REV:eagle_ms/models/
// cpu_kernels.cc` (and its kernel_common.h) instead. `perf record /tmp/wa N USED` profiles it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" int WindowAttention(int, void **, int *, int64_t **, const char **, void *, void *);

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s N USED  (query rows, 1 + the last kept slot; N <= USED <= 512)\n", argv[0]);
    return 2;
  }
  const int64_t b = 1, hq = 4, hkv = 2, d = 64, s = 2304, w = 512;
  const int64_t n = std::atoll(argv[1]), used = std::atoll(argv[2]);
  if (n < 1 || used < n || used > w) {
    std::fprintf(stderr, "need 1 <= N <= USED <= %ld\n", static_cast<long>(w));
    return 2;
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> q(b * hq * n * d), k_cache(b * hkv * s * d), v_cache(b * hkv * s * d), out(b * n * hq * d);
  for (auto *v : {&q, &k_cache, &v_cache}) {
    for (float &x : *v) x = normal(gen);
  }
  std::vector<float> scales(hkv, 0.125f);
  std::vector<uint8_t> keep(b * n * w, 0);  // row i keeps slots [0, used - n + i]: causal over the new rows
  for (int64_t i = 0; i < n; ++i) std::fill(keep.begin() + i * w, keep.begin() + i * w + used - n + i + 1, 1);
  void *params[] = {q.data(), k_cache.data(), v_cache.data(), keep.data(), scales.data(), out.data()};
  int ndims[] = {4, 2, 2, 3, 1, 3};
  int64_t s0[] = {b, hq, n, d}, s1[] = {b * hkv * s, d}, s2[] = {b * hkv * s, d}, s3[] = {b, n, w}, s4[] = {hkv},
          s5[] = {b, n, hq * d};
  int64_t *shapes[] = {s0, s1, s2, s3, s4, s5};
  const char *dtypes[] = {"float32", "float32", "float32", "bool", "float32", "float32"};
  std::vector<double> us;
  for (int call = 0; call < 300; ++call) {
    const auto start = std::chrono::steady_clock::now();
    const int rc = WindowAttention(6, params, ndims, shapes, dtypes, nullptr, nullptr);
    const auto end = std::chrono::steady_clock::now();
    if (rc != 0) {
      std::fprintf(stderr, "WindowAttention returned %d\n", rc);
      return 1;
    }
    us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  uint64_t checksum = 0;
  for (float x : out) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    checksum = checksum * 1000003u + bits;
  }
  std::sort(us.begin(), us.end());
  std::printf("N %ld, used %ld: median %.1f us over 300 calls, output checksum %016llx\n", static_cast<long>(n),
              static_cast<long>(used), us[us.size() / 2], static_cast<unsigned long long>(checksum));
  return 0;
}
