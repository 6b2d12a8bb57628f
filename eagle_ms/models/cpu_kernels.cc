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
// describe each. Every tensor is float32 and contiguous (row-major). A non-zero return makes MindSpore
// raise: 1 = wrong number of tensors, 2 = a tensor is not float32, 3 = inconsistent shapes.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kLanes = 8;  // partial sums per reduction (one AVX register of fp32)

bool all_float32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return false;
  }
  return true;
}

int64_t count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

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

// RmsNorm(x [..., H], w [G*H], eps [1]) -> y like x.
// y = x * (1 / sqrt(mean(x^2 over H) + eps)) * w_g, where row r (of the rows of length H) uses weight row
// g = r % G: G = 1 is one norm; G = 2 is the draft's two input norms over the stacked [B, N, 2, H].
extern "C" int RmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *, void *) {
  if (nparam != 4) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const int64_t h = shapes[0][ndims[0] - 1];
  const int64_t weights = count(ndims[1], shapes[1]);
  if (h <= 0 || weights % h != 0) return 3;
  const int64_t groups = weights / h;
  const int64_t rows = count(ndims[0], shapes[0]) / h;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(x + r * h, w + (r % groups) * h, eps, h, y + r * h);
  return 0;
}

// AddRmsNorm(x [..., H], a [..., H], bias [H], w [H], eps [1]) -> (s, y), both like x:
// s = x + (a + bias) (the residual add after a projection whose bias is not yet added), y = RmsNorm(s).
extern "C" int AddRmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *, void *) {
  if (nparam != 7) return 1;
  if (!all_float32(nparam, dtypes)) return 2;
  const int64_t h = shapes[0][ndims[0] - 1];
  const int64_t size = count(ndims[0], shapes[0]);
  if (h <= 0 || count(ndims[1], shapes[1]) != size || count(ndims[2], shapes[2]) != h ||
      count(ndims[3], shapes[3]) != h)
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
  const int64_t rows = count(ndims[0], shapes[0]) / width;
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
      count(ndims[1], shapes[1]) != heads * d)
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
  if (shapes[1][ndims[1] - 1] != s || n <= 0 || rows % n != 0 || count(ndims[1], shapes[1]) != b * n * s) return 3;
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
