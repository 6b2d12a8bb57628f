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

// GreedyAccept(tokens [B, N] i32, argmax [B, N] i32, paths [B, P, D+1] i32, path_lengths [B, P] i32)
//   -> (result [B, 2D+3] i32, aux_rows [B*(D+1)] i32).
// eagle_ms/verify.py ``greedy_accept``'s rule (``DeviceAccept``): path row p accepts its leading nodes
// n_i (1 <= i < length_p) with tokens[n_i] == argmax[n_{i-1}]; A = the most accepted, on the first row
// that has it. result (eagle_ms/models/step_result.py): A, then the emitted tokens argmax[n_0..n_A] and the
// node ids n_0..n_A, each 0-padded to D+1; aux_rows = b*N + node id per result slot (the accepted rows of
// the [B*N, ...] aux features; padding slots name the root's row).
extern "C" int GreedyAccept(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *, void *) {
  static const char *const want[] = {"int32", "int32", "int32", "int32", "int32", "int32"};
  if (nparam != 6) return 1;
  if (!dtypes_are(dtypes, want, 6)) return 2;
  if (ndims[0] != 2 || ndims[2] != 3) return 3;
  const int64_t b = shapes[0][0], n = shapes[0][1], p = shapes[2][1], width = shapes[2][2];
  if (p < 1 || width < 2 || element_count(ndims[1], shapes[1]) != b * n || shapes[2][0] != b ||
      element_count(ndims[3], shapes[3]) != b * p || element_count(ndims[4], shapes[4]) != b * (2 * width + 1) ||
      element_count(ndims[5], shapes[5]) != b * width)
    return 3;
  const int32_t *tokens = static_cast<const int32_t *>(params[0]), *argmax = static_cast<const int32_t *>(params[1]);
  const int32_t *paths = static_cast<const int32_t *>(params[2]);
  const int32_t *lengths = static_cast<const int32_t *>(params[3]);
  int32_t *result = static_cast<int32_t *>(params[4]), *aux_rows = static_cast<int32_t *>(params[5]);
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
  return 0;
}
