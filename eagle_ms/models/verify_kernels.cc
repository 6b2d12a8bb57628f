// The verify graph's mask and greedy acceptance as two CPU kernels (MindSpore ``ops.Custom`` AOT operators
// declared in eagle_ms/models/cpu_kernels.py, used by eagle_ms/models/verify_step.py ``VerifyStep``).
//
// Why: the composite forms (``verify_mask``: ~10 kernels; ``DeviceAccept`` + ``pack_result`` + the aux row
// ids: ~25 kernels) are small index work whose cost on MindSpore's CPU runtime is the launches
// (docs/teacher_profile.md). Results equal the composite forms' (tests/test_verify_step.py).
// Calling convention as cpu_kernels.cc; return 1 = wrong number of tensors, 2 = a wrong dtype, 3 =
// inconsistent shapes or an index out of range.
#include <cstdint>
#include <cstring>

#include "kernel_common.h"

// VerifyMask(committed_len [B] i32, tree_mask [B, N, N] bool, layout [W] i32 (its shape only))
//   -> allowed [B, N, W] bool: row k may attend to slots [0, L) and to slot L + j where tree_mask[k, j]
// (eagle_ms/models/verify_step.py ``verify_mask``; columns of the branch past W are cut off).
extern "C" int VerifyMask(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *, void *) {
  static const char *const want[] = {"int32", "bool", "int32", "bool"};
  if (nparam != 4) return 1;
  if (!dtypes_are(dtypes, want, 4)) return 2;
  if (ndims[1] != 3 || ndims[2] != 1) return 3;
  const int64_t b = shapes[1][0], n = shapes[1][1], w = shapes[2][0];
  if (shapes[1][2] != n || element_count(ndims[0], shapes[0]) != b || element_count(ndims[3], shapes[3]) != b * n * w) return 3;
  const int32_t *committed_len = static_cast<const int32_t *>(params[0]);
  const uint8_t *tree_mask = static_cast<const uint8_t *>(params[1]);
  uint8_t *allowed = static_cast<uint8_t *>(params[3]);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t start = committed_len[r] < 0 ? 0 : (committed_len[r] > w ? w : committed_len[r]);
    const int64_t branch = n < w - start ? n : w - start;
    for (int64_t k = 0; k < n; ++k) {
      uint8_t *row = allowed + (r * n + k) * w;
      std::memset(row, 1, start);
      std::memcpy(row + start, tree_mask + (r * n + k) * n, branch);
      std::memset(row + start + branch, 0, w - start - branch);
    }
  }
  return 0;
}

// True when batch row r's accepted path (node ids path[0..accepted], increasing) lands inside the cache:
// L + path[accepted] < slots.
static bool path_fits(int64_t length, const int32_t *path, int64_t accepted, int64_t slots) {
  for (int64_t i = 1; i <= accepted; ++i) {
    if (path[i] <= path[i - 1]) return false;
  }
  return length >= 0 && length + path[accepted] < slots;
}

// Moves slot L + path[i] to slot L + i (i = 1..accepted, where they differ) in each of the ``caches``
// tensors of batch row r (flat slot layout: row (r * hkv + h) * slots + slot). ``path_fits`` first.
static void commit_path(void **cache_params, int caches, int64_t r, int64_t hkv, int64_t slots, int64_t head_dim,
                        int64_t length, const int32_t *path, int64_t accepted) {
  const size_t bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t i = 1; i <= accepted; ++i) {
    if (path[i] == i) continue;
    for (int c = 0; c < caches; ++c) {
      float *cache = static_cast<float *>(cache_params[c]);
      for (int64_t h = 0; h < hkv; ++h) {
        float *head = cache + (r * hkv + h) * slots * head_dim;
        std::memcpy(head + (length + i) * head_dim, head + (length + path[i]) * head_dim, bytes);
      }
    }
  }
}

// GreedyAccept(tokens [B, N] i32, argmax [B, N] i32, paths [B, P, D+1] i32, path_lengths [B, P] i32,
//              committed_len [B] i32, cache_shape [2] i32 = (Hkv, S), caches: C >= 0 tensors [B*Hkv*S, Dh] f32)
//   -> (result [B, 2D+3] i32, aux_rows [B*(D+1)] i32).
// eagle_ms/verify.py ``greedy_accept``'s rule (``DeviceAccept``): path row p accepts its leading nodes
// n_i (1 <= i < length_p) with tokens[n_i] == argmax[n_{i-1}]; A = the most accepted, on the first row
// that has it. result (eagle_ms/models/step_result.py): A, then the emitted tokens argmax[n_0..n_A] and the
// node ids n_0..n_A, each 0-padded to D+1; aux_rows = b*N + node id per result slot (the accepted rows of
// the [B*N, ...] aux features; padding slots name the root's row).
// Commit by path, in place: in every cache (the teacher's K and V Parameters, flat slot layout of
// eagle_ms/models/kv_cache.py), slot L + n_i moves to slot L + i for i = 1..A where n_i != i, in ascending
// i (n_i >= i, so a source is never overwritten before it is read); a chain-first path moves nothing.
// The caches are written although MindSpore sees them as inputs: the graph must order every read and write
// of them before this kernel (the verify graph does: acceptance needs the argmax of every layer).
extern "C" int GreedyAccept(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *, void *) {
  static const char *const want[] = {"int32", "int32", "int32", "int32", "int32", "int32"};
  constexpr int kFixed = 6;  // the inputs before the caches
  const int caches = nparam - kFixed - 2;
  if (caches < 0) return 1;
  if (!dtypes_are(dtypes, want, kFixed) || std::strcmp(dtypes[nparam - 2], "int32") != 0 ||
      std::strcmp(dtypes[nparam - 1], "int32") != 0)
    return 2;
  for (int c = 0; c < caches; ++c) {
    if (std::strcmp(dtypes[kFixed + c], "float32") != 0) return 2;
  }
  if (ndims[0] != 2 || ndims[2] != 3) return 3;
  const int64_t b = shapes[0][0], n = shapes[0][1], p = shapes[2][1], width = shapes[2][2];
  if (p < 1 || width < 2 || element_count(ndims[1], shapes[1]) != b * n || shapes[2][0] != b ||
      element_count(ndims[3], shapes[3]) != b * p || element_count(ndims[4], shapes[4]) != b ||
      element_count(ndims[5], shapes[5]) != 2 || element_count(ndims[nparam - 2], shapes[nparam - 2]) != b * (2 * width + 1) ||
      element_count(ndims[nparam - 1], shapes[nparam - 1]) != b * width)
    return 3;
  const int32_t *cache_shape = static_cast<const int32_t *>(params[5]);
  const int64_t hkv = cache_shape[0], slots = cache_shape[1];
  const int64_t head_dim = caches > 0 && ndims[kFixed] == 2 ? shapes[kFixed][1] : 0;
  for (int c = 0; c < caches; ++c) {
    if (ndims[kFixed + c] != 2 || shapes[kFixed + c][0] != b * hkv * slots || shapes[kFixed + c][1] != head_dim) return 3;
  }
  const int32_t *committed_len = static_cast<const int32_t *>(params[4]);
  const int32_t *tokens = static_cast<const int32_t *>(params[0]), *argmax = static_cast<const int32_t *>(params[1]);
  const int32_t *paths = static_cast<const int32_t *>(params[2]);
  const int32_t *lengths = static_cast<const int32_t *>(params[3]);
  int32_t *result = static_cast<int32_t *>(params[nparam - 2]), *aux_rows = static_cast<int32_t *>(params[nparam - 1]);
  for (int64_t r = 0; r < b; ++r) {
    const int32_t *tk = tokens + r * n, *am = argmax + r * n;
    int64_t best = 0, best_len = -1;
    for (int64_t row = 0; row < p; ++row) {
      const int32_t *path = paths + (r * p + row) * width;
      for (int64_t i = 0; i < width; ++i) {
        if (path[i] < 0 || path[i] >= n) return 3;
      }
      int64_t accepted = 0;
      while (accepted + 1 < width && accepted + 1 < lengths[r * p + row] &&
             tk[path[accepted + 1]] == am[path[accepted]])
        ++accepted;
      if (accepted > best_len) best = row, best_len = accepted;  // the first row with the most
    }
    const int32_t *path = paths + (r * p + best) * width;
    int32_t *out = result + r * (2 * width + 1);
    out[0] = static_cast<int32_t>(best_len);
    for (int64_t i = 0; i < width; ++i) {
      const bool kept = i <= best_len;
      out[1 + i] = kept ? am[path[i]] : 0;
      out[1 + width + i] = kept ? path[i] : 0;
      aux_rows[r * width + i] = static_cast<int32_t>(r * n) + (kept ? path[i] : 0);
    }
  }
  if (caches == 0) return 0;
  const int64_t node_col = 1 + width;  // the node ids in result
  for (int64_t r = 0; r < b; ++r) {  // every row checked before any cache is written
    const int32_t *out = result + r * (2 * width + 1);
    if (!path_fits(committed_len[r], out + node_col, out[0], slots)) return 3;
  }
  for (int64_t r = 0; r < b; ++r) {
    const int32_t *out = result + r * (2 * width + 1);
    commit_path(params + kFixed, caches, r, hkv, slots, head_dim, committed_len[r], out + node_col, out[0]);
  }
  return 0;
}
