// Row math shared by the CPU kernels (cpu_kernels.cc: one kernel per chain of a layer; draft_kernels.cc: the
// whole EAGLE-3 draft layer and the draft tree in one kernel). One definition per operation, so that the
// fused kernels and the draft kernels compute the same bits for the same row. Everything is in an anonymous
// namespace: each translation unit gets its own private copy and the library exports none of it.
//
// Loops are written so that the compiler vectorises them without reassociating floating-point math on its
// own (no -ffast-math): sums use explicit partial accumulators, and exp is the polynomial ``exp_approx``
// below (relative error ~2e-7, exactly 0 where fp32 exp underflows).
#ifndef EAGLE_MS_MODELS_LAYER_MATH_H_
#define EAGLE_MS_MODELS_LAYER_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kLanes = 8;  // partial sums per reduction (one AVX register of fp32)

// e^x for fp32: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2/2, Cephes' degree-6 polynomial for
// e^r, times 2^n built in the exponent bits. n comes from the float sum x/ln2 + 1.5*2^23 (whose low bits
// hold it), so that the loop has no float->int conversion and vectorises. x is clamped to [-88, 88.5]:
// below about -87.7 the result is exactly 0 (2^-127 is built as the bits 0; fp32 e^x is denormal there,
// so masked logits at -1e30 give 0), above 88.38 it is +inf (n = 128).
inline float exp_approx(float x) {
  const float floor_clamped = x < -88.0f ? -88.0f : x;
  const float xc = floor_clamped > 88.5f ? 88.5f : floor_clamped;
  const float shifted = xc * 1.44269504088896341f + 12582912.0f;
  const float fn = shifted - 12582912.0f;
  const int32_t n = __builtin_bit_cast(int32_t, shifted) - 0x4B400000;
  const float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
  return e_r * __builtin_bit_cast(float, (n + 127) * (1 << 23));
}

float sum_of_squares(const float *x, int64_t h) {
  float acc[kLanes] = {0.0f};
  int64_t j = 0;
  for (; j + kLanes <= h; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] += x[j + u] * x[j + u];
  }
  float sum = 0.0f;
  for (int u = 0; u < kLanes; ++u) sum += acc[u];
  for (; j < h; ++j) sum += x[j] * x[j];
  return sum;
}

// y = x * (1 / sqrt(mean(x^2) + eps)) * w over one row of h values.
void rms_norm_row(const float *x, const float *w, float eps, int64_t h, float *y) {
  const float inv = 1.0f / std::sqrt(sum_of_squares(x, h) / static_cast<float>(h) + eps);
  for (int64_t j = 0; j < h; ++j) y[j] = x[j] * inv * w[j];
}


// s = x + (a + bias) over one row of h values, then y = RmsNorm(s) with w (``AddRmsNorm``).
void add_rms_norm_row(const float *x, const float *a, const float *bias, const float *w, float eps, int64_t h,
                      float *s, float *y) {
  for (int64_t j = 0; j < h; ++j) s[j] = x[j] + (a[j] + bias[j]);
  rms_norm_row(s, w, eps, h, y);
}

// y = silu(gate) * up over one row of ``inter`` values (``SiluMul``).
void silu_mul_row(const float *gate, const float *up, int64_t inter, float *y) {
  for (int64_t j = 0; j < inter; ++j) y[j] = gate[j] / (1.0f + exp_approx(-gate[j])) * up[j];
}

// The rotary tables of one position, as ``layers.Rotary`` makes them (sin signed for rotate-half): angle_i =
// float(position) * inv_freq[i] for i < D/2 (Rotary's float32 product), cos = [cos a, cos a], sin = [-sin a,
// sin a], with the C library's float cos and sin. Those may differ in the last bit from MindSpore's Cos and
// Sin kernels, so every path whose bits must agree (the draft's expand kernels and its tree kernel) takes its
// tables from here.
void rope_tables(int64_t position, const float *inv_freq, int64_t d, float *cos, float *sin) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    cos[i] = cos[i + half] = c;
    sin[i] = -s;
    sin[i + half] = s;
  }
}

// One head of RoPE (``RopeSplit``): x = xh + bias, out = x*cos + swap_halves(x)*sin (sin carries rotate-half's
// sign, as ``layers.Rotary`` makes it); d even, d <= 1024.
void rope_head(const float *xh, const float *bias, const float *c, const float *s, int64_t d, float *out) {
  float x[1024];
  const int64_t half = d / 2;
  for (int64_t j = 0; j < d; ++j) x[j] = xh[j] + bias[j];
  for (int64_t j = 0; j < half; ++j) out[j] = x[j] * c[j] + x[j + half] * s[j];
  for (int64_t j = half; j < d; ++j) out[j] = x[j] * c[j] + x[j - half] * s[j];
}

// The K largest of one row of v logits in descending order (equal logits: the lower index first), their
// log-softmax values (x - max) - log(sum over the row of exp(x - max)) and their target ids
// index + d2t[index] (``LogSoftmaxTopK``); K <= min(v, 1024).
void log_softmax_top_k_row(const float *x, int64_t v, const int32_t *d2t, int64_t k, float *values, int32_t *ids) {
  float best[1024];
  int64_t where[1024];
  int64_t filled = 0;
  for (int64_t i = 0; i < v; ++i) {  // insertion into the sorted K best; a tie never displaces
    if (filled == k && !(x[i] > best[k - 1])) continue;
    int64_t pos = filled < k ? filled : k - 1;
    while (pos > 0 && x[i] > best[pos - 1]) {
      best[pos] = best[pos - 1];
      where[pos] = where[pos - 1];
      --pos;
    }
    best[pos] = x[i];
    where[pos] = i;
    if (filled < k) ++filled;
  }
  const float top = best[0];
  float acc[kLanes] = {0.0f};
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) acc[u] += exp_approx(x[j + u] - top);
  }
  float total = 0.0f;
  for (int u = 0; u < kLanes; ++u) total += acc[u];
  for (; j < v; ++j) total += exp_approx(x[j] - top);
  const float log_total = std::log(total);
  for (int64_t c = 0; c < k; ++c) {
    values[c] = (best[c] - top) - log_total;
    ids[c] = static_cast<int32_t>(where[c]) + d2t[where[c]];
  }
}

// Attention over cache slots, the parts of ``WindowAttention`` (cpu_kernels.cc), whose comment states the
// per-row arithmetic these keep fixed.
constexpr int64_t kSlotBlock = 16;
constexpr int64_t kRowBlock = 4;

// The widest float vector the build targets (GCC/Clang vector extension): 16 lanes (one AVX-512 register)
// when -march=native finds AVX-512, else 8 (one AVX register on x86-64, two NEON quads on ARM). Arithmetic
// on it is lane by lane, so each lane's sums keep their order whatever the width: the results are the same
// bits on every width. (A 16-lane type without AVX-512 compiled to far slower code in a
// trial.)
#if defined(__AVX512F__)
typedef float VecF __attribute__((vector_size(64)));
#else
typedef float VecF __attribute__((vector_size(32)));
#endif
constexpr int64_t kVecLanes = sizeof(VecF) / sizeof(float);
constexpr int64_t kBlockVecs = kSlotBlock / kVecLanes;  // vectors per 16 slots (or 16 head columns)

inline VecF load_vec(const float *p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store_vec(float *p, VecF v) { std::memcpy(p, &v, sizeof v); }

// For the kRowBlock query rows qr[r]: scores[r][j] = sum over e (in order) of qr[r][e] * keys_t[e][j], j in
// [0, padded); keys_t is [d, padded] (padded a multiple of kSlotBlock = 16), scores rows are ``padded`` apart.
void block_scores(const float *const *qr, const float *keys_t, int64_t d, int64_t padded, float *scores) {
  for (int64_t jb = 0; jb < padded; jb += kSlotBlock) {
    VecF acc[kRowBlock][kBlockVecs] = {};
    for (int64_t e = 0; e < d; ++e) {
      VecF keys[kBlockVecs];
      for (int64_t u = 0; u < kBlockVecs; ++u) keys[u] = load_vec(keys_t + e * padded + jb + u * kVecLanes);
      for (int64_t r = 0; r < kRowBlock; ++r) {
        const float qe = qr[r][e];
        for (int64_t u = 0; u < kBlockVecs; ++u) acc[r][u] += qe * keys[u];
      }
    }
    for (int64_t r = 0; r < kRowBlock; ++r) {
      for (int64_t u = 0; u < kBlockVecs; ++u) store_vec(scores + r * padded + jb + u * kVecLanes, acc[r][u]);
    }
  }
}

// One row of scores -> its probabilities in place over slots [0, used): softmax of score*scale over the
// kept slots (keep[j] != 0), exactly 0 at the dropped ones. The exponentials are summed in kLanes partial
// sums (slot j into lane j % kLanes, ascending j; a dropped slot adds exactly +0) combined in lane order, so
// the row's result does not depend on ``used`` or on the other rows; every loop is branch-free and vectorises.
void row_probabilities(float *p, const uint8_t *keep, float scale, int64_t used) {
  float lane_top[kLanes];  // the largest kept scaled score per lane (a maximum: the order does not matter)
  for (int u = 0; u < kLanes; ++u) lane_top[u] = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= used; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) {
      p[j + u] = p[j + u] * scale;
      lane_top[u] = std::max(lane_top[u], keep[j + u] ? p[j + u] : -INFINITY);
    }
  }
  for (int u = 0; j < used; ++u, ++j) {
    p[j] = p[j] * scale;
    lane_top[u] = std::max(lane_top[u], keep[j] ? p[j] : -INFINITY);
  }
  float top = lane_top[0];
  for (int u = 1; u < kLanes; ++u) top = std::max(top, lane_top[u]);
  for (int64_t j = 0; j < used; ++j) {
    const float e = exp_approx(p[j] - top);  // a dropped slot's may be anything, even +inf: replaced by 0
    p[j] = keep[j] ? e : 0.0f;
  }
  float lane[kLanes] = {0.0f};
  for (j = 0; j + kLanes <= used; j += kLanes) {
    for (int u = 0; u < kLanes; ++u) lane[u] += p[j + u];
  }
  for (int u = 0; j < used; ++u, ++j) lane[u] += p[j];
  float total = 0.0f;
  for (int u = 0; u < kLanes; ++u) total += lane[u];
  for (j = 0; j < used; ++j) p[j] = p[j] / total;
}

// 1 + the last slot any of ``rows`` mask rows (``w`` slots each, contiguous; nonzero = kept) keeps; 0 if none.
int64_t slots_used(const uint8_t *mask, int64_t rows, int64_t w) {
  int64_t used = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = w; j > used; --j) {
      if (mask[i * w + j - 1]) {
        used = j;
        break;
      }
    }
  }
  return used;
}

// Slots [from, to) of one KV head, whose slot j has the key keys + j*d and the value values + j*d (the flat
// cache's rows of that head): each key into column j of keys_t [d, padded], each value's row into
// value_rows[j] (the layout ``block_scores`` and ``block_values`` read).
void load_slots(const float *keys, const float *values, int64_t from, int64_t to, int64_t d, int64_t padded,
                float *keys_t, const float **value_rows) {
  for (int64_t j = from; j < to; ++j) {
    for (int64_t e = 0; e < d; ++e) keys_t[e * padded + j] = keys[j * d + e];
    value_rows[j] = values + j * d;
  }
}

// For the kRowBlock rows of probabilities p (rows ``padded`` apart): out[r][e] = sum over j in [0, used) (in
// order) of p[r][j] * values[j][e]; values[j] points at slot j's d values (the cache's row, or a kernel's own
// copy of a row it has not written yet). A dropped slot's weight 0 adds exactly +0.
void block_values(const float *p, int64_t padded, const float *const *values, int64_t d, int64_t used,
                  float *const *out) {
  int64_t e0 = 0;
  for (; e0 + kSlotBlock <= d; e0 += kSlotBlock) {  // 16 head columns at a time
    VecF acc[kRowBlock][kBlockVecs] = {};
    for (int64_t j = 0; j < used; ++j) {
      VecF vals[kBlockVecs];
      for (int64_t u = 0; u < kBlockVecs; ++u) vals[u] = load_vec(values[j] + e0 + u * kVecLanes);
      for (int64_t r = 0; r < kRowBlock; ++r) {
        const float pj = p[r * padded + j];
        for (int64_t u = 0; u < kBlockVecs; ++u) acc[r][u] += pj * vals[u];
      }
    }
    for (int64_t r = 0; r < kRowBlock; ++r) {
      for (int64_t u = 0; u < kBlockVecs; ++u) store_vec(out[r] + e0 + u * kVecLanes, acc[r][u]);
    }
  }
  for (; e0 < d; ++e0) {  // a head size that is not a multiple of 16: the last columns one at a time
    for (int64_t r = 0; r < kRowBlock; ++r) {
      float sum = 0.0f;
      for (int64_t j = 0; j < used; ++j) sum += p[r * padded + j] * values[j][e0];
      out[r][e0] = sum;
    }
  }
}


}  // namespace

#endif  // EAGLE_MS_MODELS_LAYER_MATH_H_
