// The EAGLE-3 draft layer as two CPU kernels around its cache write, and the whole EAGLE-2 draft tree (every
// expansion depth and its bookkeeping) as one CPU kernel: MindSpore ``ops.Custom`` AOT operators declared in
// eagle_ms/models/cpu_kernels.py, used by eagle_ms/models/eagle3.py (``DraftFront`` or ``DraftExtendFront``,
// the cache write, ``DraftBack``: the extend and expand calls) and eagle_ms/models/draft_tree_step.py
// (``DraftTree``, the device step's draft tree).
//
// Why: a depth of the draft tree launched 16 kernels (five matmuls, two cache scatters, nine fused kernels)
// and the tree 9 dependent depths of them; on MindSpore's CPU runtime every launch costs a fixed 5-19 us
// whatever it computes, and the matmuls over the tree's k rows are tiny (docs/teacher_profile.md). Here a
// depth is a function call. The tree's own K/V rows never reach the cache: ``DraftTree`` keeps them in its
// own buffer (they are scratch, rewritten by the next step's extend), so it writes no Parameter.
//
// The layer kernels read the cache only after the rows' own K/V are written (a kernel that read a cache
// Parameter the same graph writes afterwards made MindSpore snapshot the whole cache: a TensorMove per call).
//
// Same bits on both paths: the expand kernels (one depth, the host path of eagle_ms/eagle3_drafter.py, whose
// tree the reference mode compares with the device tree) and ``DraftTree`` run the same ``DraftLayer`` code
// on the same inputs: the same matmul (``matmul_rows``: each output a sum over the input in ascending
// order), the row math of layer_math.h, and attention over the kept slots in slot order wherever a slot's
// K/V lives. Every row's result is independent of the other rows and of the row count.
//
// The layer (eagle_ms/models/eagle3.py ``Eagle3Draft.step`` with the 'cpu' kernels, the same operations in
// the same order): x = [RmsNorm(embed[token]) w_in, RmsNorm(feature) w_hid]; qkv = x Wqkv; RoPE on the q and
// k heads (``RopeSplit``); attention over the kept slots (``WindowAttention``); s = feature + (attn Wo + 0),
// n = RmsNorm(s) w_post; m = silu(n Wg) * (n Wu) Wdown; hidden = s + (m + 0), n2 = RmsNorm(hidden) w_final;
// the top-K of log_softmax(n2 Wlm) with target ids (``LogSoftmaxTopK``).
//
// Calling convention as cpu_kernels.cc: params = inputs then outputs, contiguous row-major. Return codes:
// 1 = wrong number of tensors, 2 = a wrong dtype, 3 = inconsistent shapes or indices out of range.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernel_common.h"
#include "layer_math.h"
#include "tree_math.h"

namespace {

// A weight matrix [in, out] as a kernel input: float32 in row-major order (the Parameters themselves), or
// float16 for weights that are exactly float16 (eagle_ms/models/eagle3.py ``Eagle3Draft`` passes float16
// copies then), in tile-major order (``matmul_rows``; eagle_ms/models/weight_tiles.py writes it). Every float16
// value widens to float32 exactly and the sums run in the same order, so the products, and the results, are
// the same bits either way; float16 halves the bytes that each depth streams through the cache, and the
// tile-major order makes them consecutive (docs/teacher_profile.md § "The draft's weights in tile order").
struct Matrix {
  const void *data;
  bool half;
};

// One vector of weights from p, widened to float32.
inline VecF load_weights(const float *p) { return load_vec(p); }

inline VecF load_weights(const _Float16 *p) {
#if defined(__AVX512F__)
  return (VecF)(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))));
#elif defined(__F16C__)
  return (VecF)(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
#else
  VecF v;
  for (int64_t e = 0; e < kVecLanes; ++e) v[e] = static_cast<float>(p[e]);
  return v;
#endif
}

// y [n, out] = x [n, in] @ w [in, out] (w row-major, or tile-major for ``kPacked``). Each y[r][j] is the sum
// over i in ascending order of x[r][i] * w[i][j], one rounding per product and per add (the library is built
// with -ffp-contract=off), so a row's result depends neither on n nor on the other rows nor on the layout.
// Rows go two at a time over 32-column tiles, so that each weight vector loaded serves both; a tile is read
// down all ``in`` rows, which in tile-major order is one run of consecutive bytes.
constexpr int64_t kTile = 32;
constexpr int64_t kTileVecs = kTile / kVecLanes;

// Where the weights of column tile j0 (j0 a multiple of kTile) start, and the distance between input rows
// inside it: row-major [in, out] (``kPacked`` false) or tile-major (true: each tile's [in, kTile] block
// contiguous, the tiles in column order, then the last out % kTile columns as [in, out % kTile]).
template <bool kPacked, typename W>
inline const W *tile_start(const W *w, int64_t j0, int64_t in, int64_t out, int64_t *stride) {
  if (!kPacked) {
    *stride = out;
    return w + j0;
  }
  *stride = j0 + kTile <= out ? kTile : out - j0;
  return w + j0 * in;
}

template <bool kPacked, typename W>
void matmul_rows(const float *x, int64_t n, int64_t in, const W *w, int64_t out, float *y) {
  int64_t j0 = 0, stride = 0;
  for (; j0 + kTile <= out; j0 += kTile) {
    const W *tile = tile_start<kPacked>(w, j0, in, out, &stride);
    for (int64_t r0 = 0; r0 < n; r0 += 2) {
      const float *x0 = x + r0 * in, *x1 = x + std::min(r0 + 1, n - 1) * in;
      VecF a0[kTileVecs] = {}, a1[kTileVecs] = {};
      for (int64_t i = 0; i < in; ++i) {
        const W *wi = tile + i * stride;
        const float s0 = x0[i], s1 = x1[i];
        for (int64_t u = 0; u < kTileVecs; ++u) {
          const VecF wv = load_weights(wi + u * kVecLanes);
          a0[u] += s0 * wv;
          a1[u] += s1 * wv;
        }
      }
      for (int64_t u = 0; u < kTileVecs; ++u) store_vec(y + r0 * out + j0 + u * kVecLanes, a0[u]);
      if (r0 + 1 < n) {
        for (int64_t u = 0; u < kTileVecs; ++u) store_vec(y + (r0 + 1) * out + j0 + u * kVecLanes, a1[u]);
      }
    }
  }
  if (j0 == out) return;
  const W *rest = tile_start<kPacked>(w, j0, in, out, &stride);
  for (; j0 < out; ++j0, ++rest) {  // the last out % kTile columns one at a time, in the same order
    for (int64_t r = 0; r < n; ++r) {
      float sum = 0.0f;
      for (int64_t i = 0; i < in; ++i) sum += x[r * in + i] * static_cast<float>(rest[i * stride]);
      y[r * out + j0] = sum;
    }
  }
}

void matmul_rows(const float *x, int64_t n, int64_t in, const Matrix &w, int64_t out, float *y) {
  if (w.half) {
    matmul_rows<true>(x, n, in, static_cast<const _Float16 *>(w.data), out, y);
  } else {
    matmul_rows<false>(x, n, in, static_cast<const float *>(w.data), out, y);
  }
}

// True when kernel input i is a weight matrix the kernels take as float32 or float16; ``half`` tells which.
bool matrix_dtype(const char **dtypes, int i, bool *half) {
  *half = std::strcmp(dtypes[i], "float16") == 0;
  return *half || std::strcmp(dtypes[i], "float32") == 0;
}

// The draft's weights and sizes, read from the kernel inputs in ``kWeightInputs`` order.
struct DraftLayer {
  int64_t h, inter, hq, hkv, d, vocab, draft_vocab;
  const float *embed, *w_in, *w_hid, *qkv_bias, *w_post, *w_final;
  Matrix w_qkv, w_o, w_gate_up, w_down, w_lm;  // float32 or float16 (``Matrix``)
  const int32_t *d2t;
  float eps;
  const float *scales;  // [hkv] score scale per KV head
  int64_t qkv_width() const { return (hq + 2 * hkv) * d; }
};

// The draft weights as kernel inputs, starting at ``first``: embed [V, H], input_layernorm [H], hidden_norm
// [H], qkv [2H, (Hq+2Hkv)D], qkv bias [(Hq+2Hkv)D], o [Hq D, H], post_attention_layernorm [H], gate_up [H, 2I],
// down [I, H], norm [H], lm_head [H, Vd], d2t [Vd] i32, eps [1], scale [Hkv] (its length gives Hkv). The five
// matrices (qkv, o, gate_up, down, lm_head) are float32 or float16 (``Matrix``), the rest float32.
constexpr int kWeightInputs = 14;
constexpr int kMatrixInputs[] = {3, 5, 7, 8, 10};

bool read_layer(void **params, int *ndims, int64_t **shapes, const char **dtypes, int first, int64_t head_dim,
                DraftLayer *layer) {
  bool half[kWeightInputs] = {};
  for (int i = 0; i < kWeightInputs; ++i) {
    const bool matrix = std::find(std::begin(kMatrixInputs), std::end(kMatrixInputs), i) != std::end(kMatrixInputs);
    if (matrix ? !matrix_dtype(dtypes, first + i, &half[i])
               : std::strcmp(dtypes[first + i], i == 11 ? "int32" : "float32") != 0)
      return false;
  }
  auto size = [&](int i) { return element_count(ndims[first + i], shapes[first + i]); };
  auto f32 = [&](int i) { return static_cast<const float *>(params[first + i]); };
  if (ndims[first] != 2 || ndims[first + 3] != 2 || ndims[first + 7] != 2 || ndims[first + 10] != 2) return false;
  DraftLayer &L = *layer;
  L.vocab = shapes[first][0];
  L.h = shapes[first][1];
  L.inter = shapes[first + 7][1] / 2;
  L.hkv = size(13);
  L.d = head_dim;
  L.draft_vocab = shapes[first + 10][1];
  const int64_t qkv = shapes[first + 3][1];
  if (L.d < 2 || L.d % 2 || L.d > 1024 || L.hkv < 1 || qkv % L.d || qkv / L.d <= 2 * L.hkv) return false;
  L.hq = qkv / L.d - 2 * L.hkv;
  if (L.hq % L.hkv || size(1) != L.h || size(2) != L.h || shapes[first + 3][0] != 2 * L.h || size(4) != qkv ||
      size(5) != L.hq * L.d * L.h || size(6) != L.h || shapes[first + 7][0] != L.h || size(8) != L.inter * L.h ||
      size(9) != L.h || shapes[first + 10][0] != L.h || size(11) != L.draft_vocab || size(12) != 1)
    return false;
  auto matrix = [&](int i) { return Matrix{params[first + i], half[i]}; };
  L.embed = f32(0), L.w_in = f32(1), L.w_hid = f32(2), L.w_qkv = matrix(3), L.qkv_bias = f32(4), L.w_o = matrix(5);
  L.w_post = f32(6), L.w_gate_up = matrix(7), L.w_down = matrix(8), L.w_final = f32(9), L.w_lm = matrix(10);
  L.d2t = static_cast<const int32_t *>(params[first + 11]);
  L.eps = *f32(12);
  L.scales = f32(13);
  return true;
}

// Working memory of one layer call over n rows.
struct LayerRows {
  std::vector<float> x, qkv, q, attn, o, s, normed, gate_up, act, mlp, normed2, logits, zeros;
  LayerRows(const DraftLayer &L, int64_t n)
      : x(n * 2 * L.h), qkv(n * L.qkv_width()), q(n * L.hq * L.d), attn(n * L.hq * L.d), o(n * L.h), s(n * L.h),
        normed(n * L.h), gate_up(n * 2 * L.inter), act(n * L.inter), mlp(n * L.h), normed2(n * L.h),
        logits(n * L.draft_vocab), zeros(L.h, 0.0f) {}
};

// The layer up to attention for n rows: tokens [n], features [n, H], cos/sin [n][D] (row r's tables at
// cos[r]) -> rows.q [n, Hq, D] and the rows' own k, v [n, Hkv, D]. False on a token outside the vocabulary.
bool layer_front(const DraftLayer &L, int64_t n, const int32_t *tokens, const float *features,
                 const float *const *cos, const float *const *sin, LayerRows &rows, float *k, float *v) {
  const int64_t h = L.h, d = L.d;
  for (int64_t r = 0; r < n; ++r) {
    if (tokens[r] < 0 || tokens[r] >= L.vocab) return false;
    rms_norm_row(L.embed + tokens[r] * h, L.w_in, L.eps, h, rows.x.data() + r * 2 * h);
    rms_norm_row(features + r * h, L.w_hid, L.eps, h, rows.x.data() + r * 2 * h + h);
  }
  matmul_rows(rows.x.data(), n, 2 * h, L.w_qkv, L.qkv_width(), rows.qkv.data());
  for (int64_t r = 0; r < n; ++r) {
    const float *row = rows.qkv.data() + r * L.qkv_width();
    for (int64_t head = 0; head < L.hq + 2 * L.hkv; ++head) {
      const float *xh = row + head * d, *bh = L.qkv_bias + head * d;
      if (head < L.hq) {
        rope_head(xh, bh, cos[r], sin[r], d, rows.q.data() + (r * L.hq + head) * d);
      } else if (head < L.hq + L.hkv) {
        rope_head(xh, bh, cos[r], sin[r], d, k + (r * L.hkv + head - L.hq) * d);
      } else {
        float *dst = v + (r * L.hkv + head - L.hq - L.hkv) * d;
        for (int64_t e = 0; e < d; ++e) dst[e] = xh[e] + bh[e];
      }
    }
  }
  return true;
}

// Attention of the n rows' queries (rows.q) over slots [0, used) -> rows.attn [n, Hq D]. Per KV head h:
// keys_t[h] [D, padded] (slot j's key in column j, padded a multiple of kSlotBlock), values[h][j] slot j's
// value row; keep[r] row r's mask over the slots (nonzero = attend). WindowAttention's row order and blocks.
void layer_attention(const DraftLayer &L, int64_t n, const float *const *keys_t,
                     const std::vector<const float *> *values, const uint8_t *const *keep, int64_t used,
                     int64_t padded, LayerRows &rows, std::vector<float> &p) {
  const int64_t d = L.d, groups = L.hq / L.hkv, count = groups * n;
  p.resize(kRowBlock * padded);
  std::vector<float> spare(d);
  for (int64_t hk = 0; hk < L.hkv; ++hk) {
    for (int64_t r0 = 0; r0 < count; r0 += kRowBlock) {
      const int64_t real = std::min(count - r0, kRowBlock);
      const float *qr[kRowBlock];
      const uint8_t *m[kRowBlock];
      float *dst[kRowBlock];
      for (int64_t r = 0; r < kRowBlock; ++r) {
        const int64_t i = r0 + (r < real ? r : 0), head = hk * groups + i / n, ni = i % n;
        qr[r] = rows.q.data() + (ni * L.hq + head) * d;
        m[r] = keep[ni];
        dst[r] = r < real ? rows.attn.data() + (ni * L.hq + head) * d : spare.data();
      }
      block_scores(qr, keys_t[hk], d, padded, p.data());
      for (int64_t r = 0; r < kRowBlock; ++r) {
        float *pr = p.data() + r * padded;
        if (r < real) {
          row_probabilities(pr, m[r], L.scales[hk], used);
        } else {
          std::fill(pr, pr + used, 0.0f);
        }
      }
      block_values(p.data(), padded, values[hk].data(), d, used, dst);
    }
  }
}

// The layer after attention for n rows: features [n, H] (the residual), rows.attn -> the top-K log-probs
// [n, K] and target ids [n, K], hidden [n, H] (the pre-norm output: the children's feature).
void layer_back(const DraftLayer &L, int64_t n, const float *features, int64_t top, LayerRows &rows,
                float *logprob, int32_t *ids, float *hidden) {
  const int64_t h = L.h, inter = L.inter;
  matmul_rows(rows.attn.data(), n, L.hq * L.d, L.w_o, h, rows.o.data());
  for (int64_t r = 0; r < n; ++r) {
    add_rms_norm_row(features + r * h, rows.o.data() + r * h, rows.zeros.data(), L.w_post, L.eps, h,
                     rows.s.data() + r * h, rows.normed.data() + r * h);
  }
  matmul_rows(rows.normed.data(), n, h, L.w_gate_up, 2 * inter, rows.gate_up.data());
  for (int64_t r = 0; r < n; ++r) {
    const float *gu = rows.gate_up.data() + r * 2 * inter;
    silu_mul_row(gu, gu + inter, inter, rows.act.data() + r * inter);
  }
  matmul_rows(rows.act.data(), n, inter, L.w_down, h, rows.mlp.data());
  for (int64_t r = 0; r < n; ++r) {
    add_rms_norm_row(rows.s.data() + r * h, rows.mlp.data() + r * h, rows.zeros.data(), L.w_final, L.eps, h,
                     hidden + r * h, rows.normed2.data() + r * h);
  }
  matmul_rows(rows.normed2.data(), n, h, L.w_lm, L.draft_vocab, rows.logits.data());
  for (int64_t r = 0; r < n; ++r) {
    log_softmax_top_k_row(rows.logits.data() + r * L.draft_vocab, L.draft_vocab, L.d2t, top, logprob + r * top,
                          ids + r * top);
  }
}

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Rows computed of batch element bi: real[bi] clamped to [0, n].
int64_t real_rows(const int32_t *real, int64_t bi, int64_t n) { return std::min<int64_t>(std::max(real[bi], 0), n); }

// The shared body of ``DraftFront`` and ``DraftExtendFront``: inputs 0, 2, 3, 4 = ids [B, n], positions
// [B, n] i32, inv_freq [D/2] (``layers.Rotary``'s; the rows' rotary tables come from ``rope_tables``), real
// [B]; features [B, n, H] in the draft's width; outputs q [B, n, Hq, D], k, v [B, n, Hkv, D] at
// params[out..out+2], zeros past the real rows.
int front_rows(const DraftLayer &L, void **params, int *ndims, int64_t **shapes, const float *features, int out) {
  const int64_t b = shapes[0][0], n = shapes[0][1], d = L.d;
  if (element_count(ndims[2], shapes[2]) != b * n || element_count(ndims[3], shapes[3]) != d / 2 ||
      element_count(ndims[4], shapes[4]) != b || element_count(ndims[out], shapes[out]) != b * n * L.hq * d)
    return 3;
  const int32_t *ids = static_cast<const int32_t *>(params[0]), *real = static_cast<const int32_t *>(params[4]);
  const int32_t *positions = static_cast<const int32_t *>(params[2]);
  const float *inv_freq = static_cast<const float *>(params[3]);
  float *q = static_cast<float *>(params[out]), *k = static_cast<float *>(params[out + 1]);
  float *v = static_cast<float *>(params[out + 2]);
  std::fill(q, q + b * n * L.hq * d, 0.0f);
  std::fill(k, k + b * n * L.hkv * d, 0.0f);
  std::fill(v, v + b * n * L.hkv * d, 0.0f);
  LayerRows rows(L, n);
  std::vector<float> tables(2 * n * d);  // row r's cos at 2rd, its sin at (2r+1)d
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t m = real_rows(real, bi, n);
    std::vector<const float *> cos(m), sin(m);
    for (int64_t r = 0; r < m; ++r) {
      float *table = tables.data() + 2 * r * d;
      rope_tables(positions[bi * n + r], inv_freq, d, table, table + d);
      cos[r] = table;
      sin[r] = table + d;
    }
    if (!layer_front(L, m, ids + bi * n, features + bi * n * L.h, cos.data(), sin.data(), rows,
                     k + bi * n * L.hkv * d, v + bi * n * L.hkv * d))
      return 3;
    std::copy(rows.q.begin(), rows.q.begin() + m * L.hq * d, q + bi * n * L.hq * d);
  }
  return 0;
}

}  // namespace

// DraftFront(ids [B, n] i32, features [B, n, H], positions [B, n] i32, inv_freq [D/2], real [B] i32,
//            <the 14 weight inputs>) -> (q [B, n, Hq, D], k [B, n, Hkv, D], v [B, n, Hkv, D]).
// The layer up to attention (input norms, q/k/v, RoPE) over the first real[b] rows (zeros for the rest): the
// expand call's first kernel. The caller writes k, v to the cache, then runs ``DraftBack``.
extern "C" int DraftFront(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *, void *) {
  constexpr int kIn = 5 + kWeightInputs;
  if (nparam != kIn + 3) return 1;
  static const char *const want[] = {"int32", "float32", "int32", "float32", "int32"};
  if (!dtypes_are(dtypes, want, 5) || !all_float32(3, dtypes + kIn)) return 2;
  if (ndims[0] != 2 || ndims[kIn] != 4) return 3;
  DraftLayer L;
  if (!read_layer(params, ndims, shapes, dtypes, 5, shapes[kIn][3], &L)) return 3;
  if (element_count(ndims[1], shapes[1]) != shapes[0][0] * shapes[0][1] * L.h) return 3;
  return front_rows(L, params, ndims, shapes, static_cast<const float *>(params[1]), kIn);
}

// DraftExtendFront(ids [B, n] i32, aux [B, n, 3Ht], positions, inv_freq, real [B] i32, fc [3Ht, H], <the 14 weight
//                  inputs>) -> (q, k, v as DraftFront's, features [B, n, H]): the extend call's first kernel,
// fc (float32 or float16, as the weight matrices) over the teacher features of the real rows, then ``DraftFront``'s math; features (zeros past the real
// rows) are the residual ``DraftBack`` takes.
extern "C" int DraftExtendFront(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *, void *) {
  constexpr int kIn = 6 + kWeightInputs;
  if (nparam != kIn + 4) return 1;
  static const char *const want[] = {"int32", "float32", "int32", "float32", "int32"};
  bool fc_half = false;
  if (!dtypes_are(dtypes, want, 5) || !matrix_dtype(dtypes, 5, &fc_half) || !all_float32(4, dtypes + kIn)) return 2;
  if (ndims[0] != 2 || ndims[1] != 3 || ndims[5] != 2 || ndims[kIn] != 4) return 3;
  DraftLayer L;
  if (!read_layer(params, ndims, shapes, dtypes, 6, shapes[kIn][3], &L)) return 3;
  const int64_t b = shapes[0][0], n = shapes[0][1], aux = shapes[1][2];
  if (shapes[1][0] != b || shapes[1][1] != n || shapes[5][0] != aux || shapes[5][1] != L.h ||
      element_count(ndims[kIn + 3], shapes[kIn + 3]) != b * n * L.h)
    return 3;
  const int32_t *real = static_cast<const int32_t *>(params[4]);
  const float *teacher = static_cast<const float *>(params[1]);
  const Matrix fc{params[5], fc_half};
  float *features = static_cast<float *>(params[kIn + 3]);
  std::fill(features, features + b * n * L.h, 0.0f);
  for (int64_t bi = 0; bi < b; ++bi) {
    matmul_rows(teacher + bi * n * aux, real_rows(real, bi, n), aux, fc, L.h, features + bi * n * L.h);
  }
  return front_rows(L, params, ndims, shapes, features, kIn);
}

// DraftBack(q [B, n, Hq, D], features [B, n, H], keep [B, n, W] bool, real [B] i32, first [B] i32,
//           k_cache [B*Hkv*S, D], v_cache [B*Hkv*S, D], <the 14 weight inputs>)
//   -> (logprob [B, n, K], target_ids [B, n, K] i32, hidden [B, n, H]).
// The layer from attention on (attention over the slots keep[r] marks, read from the cache in place after the
// rows' own K/V were written, then o, the residual norm, SwiGLU, the final norm, lm_head, log-softmax top-K)
// over rows [first[b], real[b]) (zeros for the rest: an extend whose caller keeps only its last row computes
// that row alone). K comes from the output shape.
extern "C" int DraftBack(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *, void *) {
  constexpr int kIn = 7 + kWeightInputs;
  if (nparam != kIn + 3) return 1;
  static const char *const want[] = {"float32", "float32", "bool", "int32", "int32", "float32", "float32"};
  if (!dtypes_are(dtypes, want, 7) || std::strcmp(dtypes[kIn], "float32") != 0 ||
      std::strcmp(dtypes[kIn + 1], "int32") != 0 || std::strcmp(dtypes[kIn + 2], "float32") != 0)
    return 2;
  if (ndims[0] != 4 || ndims[2] != 3 || ndims[5] != 2 || ndims[kIn] != 3) return 3;
  const int64_t b = shapes[0][0], n = shapes[0][1], d = shapes[0][3], width = shapes[2][2];
  DraftLayer L;
  if (!read_layer(params, ndims, shapes, dtypes, 7, d, &L)) return 3;
  const int64_t top = shapes[kIn][2], slots_per = shapes[5][0] / (b * L.hkv);
  if (shapes[0][2] != L.hq || top < 1 || top > std::min<int64_t>(L.draft_vocab, 1024) ||
      shapes[5][0] != b * L.hkv * slots_per || shapes[5][1] != d || width > slots_per ||
      element_count(ndims[1], shapes[1]) != b * n * L.h || element_count(ndims[2], shapes[2]) != b * n * width ||
      element_count(ndims[3], shapes[3]) != b || element_count(ndims[4], shapes[4]) != b ||
      element_count(ndims[6], shapes[6]) != shapes[5][0] * d)
    return 3;
  const float *q = static_cast<const float *>(params[0]), *features = static_cast<const float *>(params[1]);
  const uint8_t *keep = static_cast<const uint8_t *>(params[2]);
  const int32_t *real = static_cast<const int32_t *>(params[3]), *first = static_cast<const int32_t *>(params[4]);
  const float *k_cache = static_cast<const float *>(params[5]), *v_cache = static_cast<const float *>(params[6]);
  float *logprob = static_cast<float *>(params[kIn]), *hidden = static_cast<float *>(params[kIn + 2]);
  int32_t *out_ids = static_cast<int32_t *>(params[kIn + 1]);
  std::fill(logprob, logprob + b * n * top, 0.0f);
  std::fill(out_ids, out_ids + b * n * top, 0);
  std::fill(hidden, hidden + b * n * L.h, 0.0f);
  LayerRows rows(L, n);
  std::vector<float> p;
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t end = real_rows(real, bi, n), lo = std::min<int64_t>(std::max(first[bi], 0), end), m = end - lo;
    if (m == 0) continue;
    const int64_t row0 = bi * n + lo;  // rows [lo, end) of batch element bi
    std::vector<const uint8_t *> masks(m);
    for (int64_t r = 0; r < m; ++r) masks[r] = keep + (row0 + r) * width;
    const int64_t used = slots_used(keep + row0 * width, m, width);
    const int64_t padded = round_up(std::max<int64_t>(used, 1), kSlotBlock);
    std::vector<std::vector<float>> keys_t(L.hkv, std::vector<float>(d * padded, 0.0f));
    std::vector<std::vector<const float *>> values(L.hkv, std::vector<const float *>(used));
    std::vector<const float *> key_ptrs(L.hkv);
    for (int64_t hk = 0; hk < L.hkv; ++hk) {
      const int64_t base = (bi * L.hkv + hk) * slots_per * d;
      load_slots(k_cache + base, v_cache + base, 0, used, d, padded, keys_t[hk].data(), values[hk].data());
      key_ptrs[hk] = keys_t[hk].data();
    }
    std::copy(q + row0 * L.hq * d, q + (row0 + m) * L.hq * d, rows.q.begin());
    layer_attention(L, m, key_ptrs.data(), values.data(), masks.data(), used, padded, rows, p);
    layer_back(L, m, features + row0 * L.h, top, rows, logprob + row0 * top, out_ids + row0 * top,
               hidden + row0 * L.h);
  }
  return 0;
}

// DraftTree(root_logprob [B, K], root_ids [B, K] i32, root_hidden [B, H], length [B] i32, inv_freq [Dh/2],
//           k_cache [B*Hkv*S, Dh], v_cache [B*Hkv*S, Dh], settings [3] i32, cut [1],
//           layout [k, C] i32 (shape only: C = k + (D-1)k^2 gives D), <the 14 weight inputs>)
//   -> (scores [B, C], ints [B, 3, C] i32): the candidate tables of tree_kernels.cc after depths 1..D-1.
// The device step's draft tree (eagle_ms/models/draft_tree_step.py, module doc steps 3-4 without the final
// rerank, which ``TreeFinish`` does). settings = (X scratch slots, context window w or 0 = unbounded, the
// budget M); L' = length. Depth t (1..D-1) runs the layer over the k frontier rows: tokens the frontier's, features their
// parents' hidden (depth 1: root_hidden), position L'-1+t (its rotary tables from ``rope_tables``), scratch
// slot (t-1)k + r; a row sees the committed pairs [max(L'-w, 0), L') (cache slots X + pair), its ancestors'
// slots and its own, then ``tree_grow_row`` (cut: log min_path_prob or -inf). The tree's K/V stay in this
// kernel's buffers. Before each depth the exact early stop (``tree_can_stop``) ends the row's growth; the
// candidates of the depths not run stay empty (invalid), which ``TreeFinish`` never keeps: the same tree as
// running every depth.
extern "C" int DraftTree(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *, void *) {
  constexpr int kIn = 10 + kWeightInputs;
  if (nparam != kIn + 2) return 1;
  static const char *const want[] = {"float32", "int32", "float32", "int32", "float32", "float32",
                                     "float32", "int32", "float32", "int32"};
  if (!dtypes_are(dtypes, want, 10) || std::strcmp(dtypes[kIn], "float32") != 0 ||
      std::strcmp(dtypes[kIn + 1], "int32") != 0)
    return 2;
  if (ndims[0] != 2 || ndims[5] != 2 || ndims[9] != 2 || ndims[kIn] != 2) return 3;
  const int64_t b = shapes[0][0], top = shapes[0][1], d = shapes[5][1];
  const int64_t k = shapes[9][0], c = shapes[9][1];
  if (k < 1 || c < k || (c - k) % (k * k) != 0) return 3;
  const int64_t depths = (c - k) / (k * k) + 1;
  DraftLayer L;
  if (!read_layer(params, ndims, shapes, dtypes, 10, d, &L)) return 3;
  const int64_t slots_per = shapes[5][0] / (b * L.hkv);
  if (k > top || element_count(ndims[1], shapes[1]) != b * top || element_count(ndims[2], shapes[2]) != b * L.h ||
      element_count(ndims[3], shapes[3]) != b || element_count(ndims[4], shapes[4]) != d / 2 ||
      shapes[5][0] != b * L.hkv * slots_per || element_count(ndims[6], shapes[6]) != shapes[5][0] * d ||
      element_count(ndims[7], shapes[7]) != 3 || element_count(ndims[kIn], shapes[kIn]) != b * c ||
      element_count(ndims[kIn + 1], shapes[kIn + 1]) != b * 3 * c)
    return 3;
  const float *root_lp = static_cast<const float *>(params[0]), *root_hidden = static_cast<const float *>(params[2]);
  const int32_t *root_ids = static_cast<const int32_t *>(params[1]), *length = static_cast<const int32_t *>(params[3]);
  const float *inv_freq = static_cast<const float *>(params[4]);
  const float *k_cache = static_cast<const float *>(params[5]), *v_cache = static_cast<const float *>(params[6]);
  const int32_t *settings = static_cast<const int32_t *>(params[7]);
  const float cut = *static_cast<const float *>(params[8]);
  float *scores = static_cast<float *>(params[kIn]);
  int32_t *ints = static_cast<int32_t *>(params[kIn + 1]);
  const int64_t scratch = settings[0], window = settings[1], budget = settings[2];
  if (scratch < (depths - 1) * k || budget < 1) return 3;
  LayerRows rows(L, k);
  std::vector<float> p, feats(k * L.h), hidden(k * L.h), logprob(k * top), tree_k(k * L.hkv * d);
  std::vector<float> tree_values(std::max<int64_t>(depths - 1, 1) * k * L.hkv * d);  // the tree's V [slot, Hkv, D]
  std::vector<int32_t> ids(k * top), tokens(k), parent_rows(k), front_ids(k), next_ids(k);
  std::vector<float> front_scores(k), next_scores(k), table_cos(d), table_sin(d), ranked;
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t len = length[bi], lo = window > 0 ? std::max<int64_t>(len - window, 0) : 0;
    const int64_t used = scratch + len;  // committed pairs end at slot X + L' - 1
    if (len < 1 || used > slots_per) return 3;
    const int64_t padded = round_up(used, kSlotBlock);
    std::vector<std::vector<float>> keys_t(L.hkv, std::vector<float>(d * padded, 0.0f));
    std::vector<std::vector<const float *>> values(L.hkv, std::vector<const float *>(used, tree_values.data()));
    std::vector<const float *> key_ptrs(L.hkv);
    for (int64_t hk = 0; hk < L.hkv; ++hk) {  // the committed pairs [lo, L'), read from the cache once
      const int64_t base = (bi * L.hkv + hk) * slots_per * d;
      load_slots(k_cache + base, v_cache + base, scratch + lo, used, d, padded, keys_t[hk].data(),
                 values[hk].data());
      key_ptrs[hk] = keys_t[hk].data();
    }
    std::vector<uint8_t> masks(k * used, 0), next_masks(k * used);
    for (int64_t r = 0; r < k; ++r) std::fill(masks.begin() + r * used + scratch + lo, masks.begin() + (r + 1) * used, 1);
    float *s = scores + bi * c;
    int32_t *table = ints + bi * 3 * c;
    tree_start_row(root_lp + bi * top, root_ids + bi * top, k, c, s, table, front_scores.data(), front_ids.data(),
                   tokens.data());
    for (int64_t r = 0; r < k; ++r) std::copy(root_hidden + bi * L.h, root_hidden + (bi + 1) * L.h, feats.begin() + r * L.h);
    for (int64_t t = 1; t < depths; ++t) {
      if (tree_can_stop(s, table + kValid * c, k + (t - 1) * k * k, front_scores.data(), front_ids.data(), k, budget,
                        ranked))
        break;
      rope_tables(len - 1 + t, inv_freq, d, table_cos.data(), table_sin.data());
      std::vector<const float *> cos(k, table_cos.data()), sin(k, table_sin.data());
      std::vector<const uint8_t *> keep(k);
      // depth t's rows are scratch slots (t-1)k .. tk-1: their V goes straight to its place in tree_values
      if (!layer_front(L, k, tokens.data(), feats.data(), cos.data(), sin.data(), rows, tree_k.data(),
                       tree_values.data() + (t - 1) * k * L.hkv * d))
        return 3;
      for (int64_t r = 0; r < k; ++r) {  // this depth's rows into their scratch slots
        const int64_t slot = (t - 1) * k + r;
        masks[r * used + slot] = 1;
        keep[r] = masks.data() + r * used;
        for (int64_t hk = 0; hk < L.hkv; ++hk) {
          const float *key = tree_k.data() + (r * L.hkv + hk) * d;
          for (int64_t e = 0; e < d; ++e) keys_t[hk][e * padded + slot] = key[e];
          values[hk][slot] = tree_values.data() + (slot * L.hkv + hk) * d;
        }
      }
      layer_attention(L, k, key_ptrs.data(), values.data(), keep.data(), used, padded, rows, p);
      layer_back(L, k, feats.data(), top, rows, logprob.data(), ids.data(), hidden.data());
      if (!tree_grow_row(s, table, c, front_scores.data(), front_ids.data(), logprob.data(), ids.data(), top, k,
                         static_cast<int32_t>(k + (t - 1) * k * k), cut, next_scores.data(), next_ids.data(),
                         tokens.data(), parent_rows.data()))
        return 3;
      front_scores.swap(next_scores);
      front_ids.swap(next_ids);
      for (int64_t r = 0; r < k; ++r) {  // the next depth's rows: their parents' hidden and masks
        const int64_t parent = parent_rows[r];
        std::copy(hidden.begin() + parent * L.h, hidden.begin() + (parent + 1) * L.h, feats.begin() + r * L.h);
        std::copy(masks.begin() + parent * used, masks.begin() + (parent + 1) * used, next_masks.begin() + r * used);
      }
      masks.swap(next_masks);
    }
  }
  return 0;
}
