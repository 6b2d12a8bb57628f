// Fused CPU kernels of the teacher and draft layers, called from MindSpore graphs as ``ops.Custom`` AOT
// operators (eagle_ms/models/cpu_kernels.py builds this file and declares the operators).
//
// Why: on MindSpore's CPU runtime every launched kernel costs a fixed 5-19 us whatever it computes
// (docs/teacher_profile.md), and RMSNorm, the residual adds, SwiGLU, RoPE and the masked softmax are chains
// of small elementwise kernels. Each function below is one kernel for one such chain, with the math of the
// composite form in eagle_ms/models/layers.py, attention_layer.py and attention.py (the reference mode
// runs that form). Loops are written so that the compiler vectorises them without reassociating
// floating-point math on its own (no -ffast-math): sums use explicit partial accumulators, and exp is the
// polynomial ``exp_approx`` below (relative error ~2e-7, exactly 0 where fp32 exp underflows).
//
// Calling convention (MindSpore AOT, CPU): params holds the inputs, then the outputs; ndims/shapes/dtypes
// describe each. Every tensor is contiguous (row-major) and float32 unless its kernel says otherwise. A
// non-zero return makes MindSpore raise: 1 = wrong number of tensors, 2 = a wrong dtype, 3 = inconsistent
// shapes.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>

#include "kernel_common.h"

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

}  // namespace

// RmsNorm(x [..., H], w [H], eps [1]) -> y like x: y = x * (1 / sqrt(mean(x^2 over H) + eps)) * w per row.
extern "C" int RmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *, void *) {
  if (nparam != 4) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const int64_t h = shapes[0][ndims[0] - 1];
  if (h <= 0 || element_count(ndims[1], shapes[1]) != h) return 3;
  const int64_t rows = element_count(ndims[0], shapes[0]) / h;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(x + r * h, w, eps, h, y + r * h);
  return 0;
}

// EmbedPairNorm(table [V, H], ids [B, N] int32, feature [B, N, H], w_embed [H], w_feature [H], eps [1])
//   -> y [B, N, 2H]: row (b, n) is RmsNorm(table[ids[b, n]]) with w_embed, then RmsNorm(feature[b, n]) with
// w_feature (the EAGLE-3 draft's input: the embedding lookup and its two input norms, each row normed as
// RmsNorm does). An id outside [0, V) is an error (return 3).
extern "C" int EmbedPairNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *, void *) {
  if (nparam != 7) return 1;
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], i == 1 ? "int32" : "float32") != 0) return 2;
  }
  if (ndims[0] != 2) return 3;
  const int64_t vocab = shapes[0][0], h = shapes[0][1], rows = element_count(ndims[1], shapes[1]);
  if (h <= 0 || element_count(ndims[2], shapes[2]) != rows * h || element_count(ndims[3], shapes[3]) != h ||
      element_count(ndims[4], shapes[4]) != h || element_count(ndims[6], shapes[6]) != rows * 2 * h)
    return 3;
  const float *table = static_cast<const float *>(params[0]);
  const int32_t *ids = static_cast<const int32_t *>(params[1]);
  const float *feature = static_cast<const float *>(params[2]);
  const float *w_embed = static_cast<const float *>(params[3]);
  const float *w_feature = static_cast<const float *>(params[4]);
  const float eps = *static_cast<const float *>(params[5]);
  float *y = static_cast<float *>(params[6]);
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[r] < 0 || ids[r] >= vocab) return 3;
    rms_norm_row(table + ids[r] * h, w_embed, eps, h, y + r * 2 * h);
    rms_norm_row(feature + r * h, w_feature, eps, h, y + r * 2 * h + h);
  }
  return 0;
}

// AddRmsNorm(x [..., H], a [..., H], bias [H], w [H], eps [1]) -> (s, y), both like x:
// s = x + (a + bias) (the residual add after a projection whose bias is not yet added), y = RmsNorm(s).
extern "C" int AddRmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *, void *) {
  if (nparam != 7) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const int64_t h = shapes[0][ndims[0] - 1];
  const int64_t size = element_count(ndims[0], shapes[0]);
  if (h <= 0 || element_count(ndims[1], shapes[1]) != size || element_count(ndims[2], shapes[2]) != h ||
      element_count(ndims[3], shapes[3]) != h)
    return 3;
  const float *x = static_cast<const float *>(params[0]);
  const float *a = static_cast<const float *>(params[1]);
  const float *bias = static_cast<const float *>(params[2]);
  const float *w = static_cast<const float *>(params[3]);
  const float eps = *static_cast<const float *>(params[4]);
  float *s = static_cast<float *>(params[5]);
  float *y = static_cast<float *>(params[6]);
  for (int64_t r = 0; r < size / h; ++r) {
    float *sr = s + r * h;
    for (int64_t j = 0; j < h; ++j) sr[j] = x[r * h + j] + (a[r * h + j] + bias[j]);
    rms_norm_row(sr, w, eps, h, y + r * h);
  }
  return 0;
}

// SiluMul(gate_up [..., 2I]) -> y [..., I]: y = silu(gate) * up, gate = the first I columns, up = the last I.
extern "C" int SiluMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *, void *) {
  if (nparam != 2) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const int64_t width = shapes[0][ndims[0] - 1];
  const int64_t inter = shapes[1][ndims[1] - 1];
  if (width != 2 * inter) return 3;
  const int64_t rows = element_count(ndims[0], shapes[0]) / width;
  const float *gu = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  for (int64_t r = 0; r < rows; ++r) {
    const float *gate = gu + r * width;
    const float *up = gate + inter;
    float *yr = y + r * inter;
    for (int64_t j = 0; j < inter; ++j) yr[j] = gate[j] / (1.0f + exp_approx(-gate[j])) * up[j];
  }
  return 0;
}

// RopeSplit(qkv [B, N, Hq + 2Hkv, D], bias [(Hq + 2Hkv) * D], cos [B, Nc, D], sin [B, Nc, D])
//   -> q [B, Hq, N, D], k [B, N, Hkv, D], v [B, N, Hkv, D].
// x = qkv + bias; the q and k heads are rotated, x*cos + swap_halves(x)*sin (sin carries rotate-half's
// sign, as ``layers.Rotary`` makes it); v is copied. Nc = N (a position per row) or 1 (one for all rows).
// q comes out head-major, the layout the attention reads; k and v in the cache's write layout.
extern "C" int RopeSplit(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *, void *) {
  if (nparam != 7) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  if (ndims[0] != 4 || ndims[2] != 3 || ndims[3] != 3 || ndims[4] != 4 || ndims[5] != 4) return 3;
  const int64_t b = shapes[0][0], n = shapes[0][1], heads = shapes[0][2], d = shapes[0][3];
  const int64_t hq = shapes[4][1], hkv = shapes[5][2], nc = shapes[2][1];
  if (heads != hq + 2 * hkv || d % 2 != 0 || d > 1024 || (nc != n && nc != 1) ||
      element_count(ndims[1], shapes[1]) != heads * d)
    return 3;
  const float *qkv = static_cast<const float *>(params[0]);
  const float *bias = static_cast<const float *>(params[1]);
  const float *cos = static_cast<const float *>(params[2]);
  const float *sin = static_cast<const float *>(params[3]);
  float *q = static_cast<float *>(params[4]);
  float *k = static_cast<float *>(params[5]);
  float *v = static_cast<float *>(params[6]);
  const int64_t half = d / 2;
  float x[1024];
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ni = 0; ni < n; ++ni) {
      const int64_t table = (bi * nc + (nc == 1 ? 0 : ni)) * d;
      const float *c = cos + table;
      const float *s = sin + table;
      const float *row = qkv + (bi * n + ni) * heads * d;
      for (int64_t h = 0; h < heads; ++h) {
        const float *xh = row + h * d;
        const float *bh = bias + h * d;
        if (h >= hq + hkv) {
          float *dst = v + ((bi * n + ni) * hkv + (h - hq - hkv)) * d;
          for (int64_t j = 0; j < d; ++j) dst[j] = xh[j] + bh[j];
          continue;
        }
        float *out = h < hq ? q + ((bi * hq + h) * n + ni) * d : k + ((bi * n + ni) * hkv + (h - hq)) * d;
        for (int64_t j = 0; j < d; ++j) x[j] = xh[j] + bh[j];
        for (int64_t j = 0; j < half; ++j) out[j] = x[j] * c[j] + x[j + half] * s[j];
        for (int64_t j = half; j < d; ++j) out[j] = x[j] * c[j] + x[j - half] * s[j];
      }
    }
  }
  return 0;
}

// MaskedSoftmax(scores [B, Hkv, G*N, S], mask [B, N, S] (any shape of B*N*S values), scale [1])
//   -> probs like scores: softmax over S of scores*scale + mask, row (b, h, g*N + n) taking mask row (b, n).
// The mask is additive (0 keep, -1e30 drop: eagle_ms/models/attention.py); a dropped slot gets exactly 0.
extern "C" int MaskedSoftmax(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *, void *) {
  if (nparam != 4) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  if (ndims[0] != 4 || ndims[1] < 2) return 3;
  const int64_t b = shapes[0][0], hkv = shapes[0][1], rows = shapes[0][2], s = shapes[0][3];
  const int64_t n = shapes[1][ndims[1] - 2];
  if (shapes[1][ndims[1] - 1] != s || n <= 0 || rows % n != 0 || element_count(ndims[1], shapes[1]) != b * n * s) return 3;
  const float *scores = static_cast<const float *>(params[0]);
  const float *mask = static_cast<const float *>(params[1]);
  const float scale = *static_cast<const float *>(params[2]);
  float *probs = static_cast<float *>(params[3]);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < hkv; ++hi) {
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t offset = ((bi * hkv + hi) * rows + i) * s;
        const float *x = scores + offset;
        const float *m = mask + (bi * n + i % n) * s;
        float *p = probs + offset;
        for (int64_t j = 0; j < s; ++j) p[j] = x[j] * scale + m[j];
        float peak[kLanes];
        for (int u = 0; u < kLanes; ++u) peak[u] = -INFINITY;
        int64_t j = 0;
        for (; j + kLanes <= s; j += kLanes) {
          for (int u = 0; u < kLanes; ++u) peak[u] = p[j + u] > peak[u] ? p[j + u] : peak[u];
        }
        float top = -INFINITY;
        for (int u = 0; u < kLanes; ++u) top = peak[u] > top ? peak[u] : top;
        for (; j < s; ++j) top = p[j] > top ? p[j] : top;
        float acc[kLanes] = {0.0f};
        j = 0;
        for (; j + kLanes <= s; j += kLanes) {
          for (int u = 0; u < kLanes; ++u) {
            p[j + u] = exp_approx(p[j + u] - top);
            acc[u] += p[j + u];
          }
        }
        float total = 0.0f;
        for (int u = 0; u < kLanes; ++u) total += acc[u];
        for (; j < s; ++j) {
          p[j] = exp_approx(p[j] - top);
          total += p[j];
        }
        for (j = 0; j < s; ++j) p[j] /= total;
      }
    }
  }
  return 0;
}

// WindowAttention(q [B, Hq, N, D], k_cache [B*Hkv*S, D], v_cache [B*Hkv*S, D], keep [B, N, W] bool (any shape
//   of B*N*W values), scale [Hkv]) -> out [B, N, Hq*D].
// Attention of each query row over cache slots [0, W) of its KV head, read in place from the flat cache
// (eagle_ms/models/kv_cache.py: row (b*Hkv + h)*S + slot), so the window is never gathered. Query head
// qh = h*G + g uses KV head h (G = Hq/Hkv). scale holds the score scale once per KV head (its length gives
// Hkv). ``keep`` is the models' bool mask itself (eagle_ms/models/attention.py: True = the row may attend to
// the slot), so no additive mask is built; a dropped slot gets probability exactly 0 (its value vector is
// weighted by 0: it adds exactly +0 for the finite values a cache holds). Every row keeps at least one slot
// (the callers' contract).
// Each row's arithmetic is fixed: its scores are sequential sums over D, its softmax sums its kept slots'
// exponentials in kLanes partial sums (slot j into lane j % kLanes, ascending j) and its value sum runs over
// its kept slots in ascending order. So a row's result does not depend on N, on the other rows or on the
// window's dropped slots (tests/test_cpu_kernels.py checks this bitwise), nor on the build's vector width.
// Layout of the work: per (b, h) the keys of slots [0, J) (J = 1 + the last slot any row of b keeps) are
// transposed once into [D, J'] (J' = J rounded up to kSlotBlock, zero padded), so that scores are vector
// multiply-adds with no horizontal sums; the G*N rows of a KV head go kRowBlock at a time, so that each key
// and value vector loaded serves several rows.
namespace {

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

// For the kRowBlock rows of probabilities p (rows ``padded`` apart): out[r][e] = sum over j in [0, used) (in
// order) of p[r][j] * values[j][e]; d values per slot row. A dropped slot's weight 0 adds exactly +0.
void block_values(const float *p, int64_t padded, const float *values, int64_t d, int64_t used, float *const *out) {
  int64_t e0 = 0;
  for (; e0 + kSlotBlock <= d; e0 += kSlotBlock) {  // 16 head columns at a time
    VecF acc[kRowBlock][kBlockVecs] = {};
    for (int64_t j = 0; j < used; ++j) {
      VecF vals[kBlockVecs];
      for (int64_t u = 0; u < kBlockVecs; ++u) vals[u] = load_vec(values + j * d + e0 + u * kVecLanes);
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
      for (int64_t j = 0; j < used; ++j) sum += p[r * padded + j] * values[j * d + e0];
      out[r][e0] = sum;
    }
  }
}

}  // namespace

extern "C" int WindowAttention(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *, void *) {
  if (nparam != 6) return 1;
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], i == 3 ? "bool" : "float32") != 0) return 2;
  }
  if (ndims[0] != 4 || ndims[1] != 2 || ndims[2] != 2 || ndims[4] != 1 || ndims[3] < 1) return 3;
  const int64_t b = shapes[0][0], hq = shapes[0][1], n = shapes[0][2], d = shapes[0][3];
  const int64_t hkv = shapes[4][0], cache_rows = shapes[1][0], w = shapes[3][ndims[3] - 1];
  if (hkv <= 0 || hq % hkv != 0 || d > 1024 || shapes[1][1] != d || shapes[2][0] != cache_rows ||
      shapes[2][1] != d || cache_rows % (b * hkv) != 0 || element_count(ndims[3], shapes[3]) != b * n * w ||
      element_count(ndims[5], shapes[5]) != b * n * hq * d)
    return 3;
  const int64_t s = cache_rows / (b * hkv), groups = hq / hkv, rows = groups * n;
  if (w > s) return 3;
  const float *q = static_cast<const float *>(params[0]);
  const float *k_cache = static_cast<const float *>(params[1]);
  const float *v_cache = static_cast<const float *>(params[2]);
  const uint8_t *mask = static_cast<const uint8_t *>(params[3]);
  const float *scales = static_cast<const float *>(params[4]);
  float *out = static_cast<float *>(params[5]);
  std::vector<float> keys_t, p;
  std::vector<float> scratch(d);  // the output of a short block's padding rows
  for (int64_t bi = 0; bi < b; ++bi) {
    const uint8_t *mb = mask + bi * n * w;
    int64_t used = 0;  // J: 1 + the last slot a row of this batch element keeps
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = w; j > used; --j) {
        if (mb[i * w + j - 1]) {
          used = j;
          break;
        }
      }
    }
    const int64_t padded = (used + kSlotBlock - 1) / kSlotBlock * kSlotBlock;
    keys_t.assign(d * padded, 0.0f);
    p.resize(kRowBlock * padded);
    for (int64_t h = 0; h < hkv; ++h) {
      const float *keys = k_cache + (bi * hkv + h) * s * d;
      const float *values = v_cache + (bi * hkv + h) * s * d;
      for (int64_t j = 0; j < used; ++j) {
        for (int64_t e = 0; e < d; ++e) keys_t[e * padded + j] = keys[j * d + e];
      }
      // row i of this KV head: query head h*G + i/N, position i%N; a short last block repeats its first row
      for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        const int64_t count_rows = rows - r0 < kRowBlock ? rows - r0 : kRowBlock;
        const float *qr[kRowBlock];
        const uint8_t *m[kRowBlock];
        float *dst[kRowBlock];
        for (int64_t r = 0; r < kRowBlock; ++r) {
          const int64_t i = r0 + (r < count_rows ? r : 0), head = h * groups + i / n, ni = i % n;
          qr[r] = q + ((bi * hq + head) * n + ni) * d;
          m[r] = mb + ni * w;
          dst[r] = r < count_rows ? out + ((bi * n + ni) * hq + head) * d : scratch.data();
        }
        block_scores(qr, keys_t.data(), d, padded, p.data());
        for (int64_t r = 0; r < kRowBlock; ++r) {
          float *pr = p.data() + r * padded;
          if (r < count_rows) {
            row_probabilities(pr, m[r], scales[h], used);
          } else {
            std::fill(pr, pr + used, 0.0f);  // padding rows of a short block: weight 0, written to scratch
          }
        }
        block_values(p.data(), padded, values, d, used, dst);
      }
    }
  }
  return 0;
}

// LogSoftmaxTopK(logits [..., V] float32, d2t [V] int32) -> (values [..., K] float32, ids [..., K] int32).
// Per row: the K largest logits in descending order (equal logits: the lower index first), their
// log-softmax values (x - max) - log(sum over the row of exp(x - max)), and their target ids
// index + d2t[index] (the EAGLE-3 draft-to-target offsets). K comes from the output shapes, K <= V.
extern "C" int LogSoftmaxTopK(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *, void *) {
  if (nparam != 4) return 1;
  if (std::strcmp(dtypes[0], "float32") != 0 || std::strcmp(dtypes[1], "int32") != 0 ||
      std::strcmp(dtypes[2], "float32") != 0 || std::strcmp(dtypes[3], "int32") != 0)
    return 2;
  const int64_t v = shapes[0][ndims[0] - 1], k = shapes[2][ndims[2] - 1];
  const int64_t rows = v > 0 ? element_count(ndims[0], shapes[0]) / v : 0;
  if (v <= 0 || k <= 0 || k > v || k > 1024 || element_count(ndims[1], shapes[1]) != v ||
      element_count(ndims[2], shapes[2]) != rows * k || element_count(ndims[3], shapes[3]) != rows * k)
    return 3;
  const float *logits = static_cast<const float *>(params[0]);
  const int32_t *d2t = static_cast<const int32_t *>(params[1]);
  float *values = static_cast<float *>(params[2]);
  int32_t *ids = static_cast<int32_t *>(params[3]);
  float best[1024];
  int64_t where[1024];
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = logits + r * v;
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
      values[r * k + c] = (best[c] - top) - log_total;
      ids[r * k + c] = static_cast<int32_t>(where[c]) + d2t[where[c]];
    }
  }
  return 0;
}
