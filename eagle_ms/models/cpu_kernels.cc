// Fused CPU kernels of the teacher and draft layers, called from MindSpore graphs as ``ops.Custom`` AOT
// operators (eagle_ms/models/cpu_kernels.py builds this file and declares the operators).
//
// Why: on MindSpore's CPU runtime every launched kernel costs a fixed 5-19 us whatever it computes
// (docs/teacher_profile.md), and RMSNorm, the residual adds, SwiGLU, RoPE and the masked softmax are chains
// of small elementwise kernels. Each function below is one kernel for one such chain, with the math of the
// composite form in eagle_ms/models/layers.py, attention_layer.py and attention.py (the reference mode
// runs that form). Loops are written so that the compiler vectorises them without reassociating
// floating-point math on its own (no -ffast-math): sums use explicit partial accumulators, and exp is the
// polynomial ``exp_approx`` of layer_math.h (relative error ~2e-7, exactly 0 where fp32 exp underflows).
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

#include "layer_math.h"


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
    add_rms_norm_row(x + r * h, a + r * h, bias, w, eps, h, s + r * h, y + r * h);
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
    silu_mul_row(gu + r * width, gu + r * width + inter, inter, y + r * inter);
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
        rope_head(xh, bh, c, s, d, h < hq ? q + ((bi * hq + h) * n + ni) * d : k + ((bi * n + ni) * hkv + (h - hq)) * d);
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
  std::vector<const float *> value_rows;
  std::vector<float> scratch(d);  // the output of a short block's padding rows
  for (int64_t bi = 0; bi < b; ++bi) {
    const uint8_t *mb = mask + bi * n * w;
    const int64_t used = slots_used(mb, n, w);  // J: 1 + the last slot a row of this batch element keeps
    const int64_t padded = (used + kSlotBlock - 1) / kSlotBlock * kSlotBlock;
    keys_t.assign(d * padded, 0.0f);
    p.resize(kRowBlock * padded);
    value_rows.resize(used);
    for (int64_t h = 0; h < hkv; ++h) {
      const float *keys = k_cache + (bi * hkv + h) * s * d;
      const float *values = v_cache + (bi * hkv + h) * s * d;
      load_slots(keys, values, 0, used, d, padded, keys_t.data(), value_rows.data());
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
        block_values(p.data(), padded, value_rows.data(), d, used, dst);
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
  for (int64_t r = 0; r < rows; ++r) log_softmax_top_k_row(logits + r * v, v, d2t, k, values + r * k, ids + r * k);
  return 0;
}
