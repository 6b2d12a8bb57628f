// The EAGLE-2 tree bookkeeping of the draft graph as three CPU kernels (MindSpore ``ops.Custom`` AOT
// operators declared in eagle_ms/models/cpu_kernels.py, used by eagle_ms/models/tree_kernels.py).
//
// Why: the composite form (eagle_ms/models/tree_graph.py ``TreeGrowth``) is about 22 small kernels per
// expansion depth and about 90 for the rerank and the tree tensors; on MindSpore's CPU runtime each launch
// costs a fixed 5-19 us whatever it computes (docs/teacher_profile.md), so the bookkeeping of a 10-deep
// tree cost more dispatch than the draft layer's math. Here each depth is one kernel and the rerank plus
// tree tensors are one kernel. The results equal the composite form's (and eagle_ms/drafting.py
// ``build_tree`` + eagle_ms/tree.py ``chain_first``/``tensorize``): scores are the same float32 sums, the
// ranking key is the same (valid first, score descending, then creation index ascending).
//
// Candidate tables (C = k + (D-1) k^2 candidates in creation order, as ``build_tree`` numbers them):
//   scores [B, C] float32; ints [B, 3, C] int32 with rows token, parent (candidate id, -1 = the root) and
//   valid (0 / 1: the candidate exists; 0 after a min_path_prob cut, and for slots not yet grown).
// Frontier: scores [B, k] float32, candidate ids [B, k] int32, best first.
//
// Calling convention as cpu_kernels.cc: params = inputs then outputs, contiguous row-major. Return codes:
// 1 = wrong number of tensors, 2 = a wrong dtype, 3 = inconsistent shapes or indices out of range.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_common.h"
#include "tree_math.h"


// TreeStart(root_logprob [B, K] f32, root_ids [B, K] i32, layout [k, C] i32)
//   -> (scores [B, C] f32, ints [B, 3, C] i32, front_scores [B, k] f32, front_ids [B, k] i32,
//       front_tokens [B, k] i32).
// Depth 1: candidates 0..k-1 are the root pair's first k top-K entries (score min(log p, 0), parent -1,
// valid); every other slot is empty (score 0, token 0, parent -1, invalid). ``layout`` carries k and C in
// its shape only (MindSpore infers output shapes from input shapes, and caches them by input shapes).
extern "C" int TreeStart(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *, void *) {
  static const char *const want[] = {"float32", "int32", "int32", "float32", "int32", "float32", "int32", "int32"};
  if (nparam != 8) return 1;
  if (!dtypes_are(dtypes, want, 8)) return 2;
  const int64_t b = shapes[0][0], top = shapes[0][ndims[0] - 1];
  const int64_t k = ndims[2] == 2 ? shapes[2][0] : 0, c = ndims[2] == 2 ? shapes[2][1] : 0;
  if (k < 1 || k > top || k > c || element_count(ndims[1], shapes[1]) != b * top ||
      element_count(ndims[3], shapes[3]) != b * c || element_count(ndims[4], shapes[4]) != b * 3 * c ||
      element_count(ndims[5], shapes[5]) != b * k || element_count(ndims[6], shapes[6]) != b * k ||
      element_count(ndims[7], shapes[7]) != b * k)
    return 3;
  const float *root_lp = static_cast<const float *>(params[0]);
  const int32_t *root_ids = static_cast<const int32_t *>(params[1]);
  float *scores = static_cast<float *>(params[3]);
  int32_t *ints = static_cast<int32_t *>(params[4]);
  float *front_scores = static_cast<float *>(params[5]);
  int32_t *front_ids = static_cast<int32_t *>(params[6]), *front_tokens = static_cast<int32_t *>(params[7]);
  for (int64_t r = 0; r < b; ++r) {
    tree_start_row(root_lp + r * top, root_ids + r * top, k, c, scores + r * c, ints + r * 3 * c,
                   front_scores + r * k, front_ids + r * k, front_tokens + r * k);
  }
  return 0;
}

// TreeGrow(scores [B, C] f32, ints [B, 3, C] i32, front_scores [B, k] f32, front_ids [B, k] i32,
//          logprob [B, k, K] f32, target_ids [B, k, K] i32, first [1] i32, cut [1] f32)
//   -> (scores, ints, front_scores, front_ids, front_tokens [B, k] i32, parent_rows [B, k] i32).
// One expansion depth (``TreeGrowth.grow``): the frontier row r's child c gets candidate id
// first + r*k + c, score front_scores[r] + min(logprob[r, c], 0), token target_ids[r, c], parent
// front_ids[r]; the children are valid iff the frontier is (its first candidate's flag) and the best
// frontier score >= cut (log min_path_prob; -inf when unset). The new frontier is the k best children
// (score descending, ties lower id); parent_rows = their rows r (the rows of this expand call).
extern "C" int TreeGrow(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *, void *) {
  static const char *const want[] = {"float32", "int32", "float32", "int32", "float32", "int32", "int32",
                                     "float32", "float32", "int32", "float32", "int32", "int32", "int32"};
  if (nparam != 14) return 1;
  if (!dtypes_are(dtypes, want, 14)) return 2;
  const int64_t b = shapes[0][0], c = shapes[0][ndims[0] - 1], k = shapes[2][ndims[2] - 1];
  const int64_t top = shapes[4][ndims[4] - 1];
  const int32_t first = *static_cast<const int32_t *>(params[6]);
  if (k < 1 || k > top || element_count(ndims[0], shapes[0]) != b * c || element_count(ndims[1], shapes[1]) != b * 3 * c ||
      element_count(ndims[2], shapes[2]) != b * k || element_count(ndims[3], shapes[3]) != b * k ||
      element_count(ndims[4], shapes[4]) != b * k * top || element_count(ndims[5], shapes[5]) != b * k * top ||
      first < k || first + k * k > c)
    return 3;
  const float *in_scores = static_cast<const float *>(params[0]);
  const int32_t *in_ints = static_cast<const int32_t *>(params[1]);
  const float *in_front_scores = static_cast<const float *>(params[2]);
  const int32_t *in_front_ids = static_cast<const int32_t *>(params[3]);
  const float *logprob = static_cast<const float *>(params[4]);
  const int32_t *target_ids = static_cast<const int32_t *>(params[5]);
  const float cut = *static_cast<const float *>(params[7]);
  float *scores = static_cast<float *>(params[8]);
  int32_t *ints = static_cast<int32_t *>(params[9]);
  float *front_scores = static_cast<float *>(params[10]);
  int32_t *front_ids = static_cast<int32_t *>(params[11]), *front_tokens = static_cast<int32_t *>(params[12]);
  int32_t *parent_rows = static_cast<int32_t *>(params[13]);
  std::memcpy(scores, in_scores, sizeof(float) * b * c);
  std::memcpy(ints, in_ints, sizeof(int32_t) * b * 3 * c);
  for (int64_t r = 0; r < b; ++r) {
    if (!tree_grow_row(scores + r * c, ints + r * 3 * c, c, in_front_scores + r * k, in_front_ids + r * k,
                       logprob + r * k * top, target_ids + r * k * top, top, k, first, cut, front_scores + r * k,
                       front_ids + r * k, front_tokens + r * k, parent_rows + r * k))
      return 3;
  }
  return 0;
}

// ExtendInputs(result [B, 2D+3] i32, committed_len [B] i32, settings [3] i32, columns [X+W] i32 (shape only),
//              heads [Hkv] i32 (shape only))
//   -> (ids [B, D+1] i32, positions [B, D+1] i32, cache_rows [B*(D+1)*Hkv] i32, allowed [B, D+1, X+W] bool,
//       A [B] i32, real rows max(A + 1, 0) [B] i32, L' = L + A + 1 [B] i32).
// The draft extend's rows (eagle_ms/models/draft_tree_step.py ``DraftTreeStep.extend``): settings = (X
// scratch slots, draft cache capacity S, context window w or 0 = unbounded). Row i <= A (A =
// result[:, 0], the emitted tokens in columns 1..D+1) is pair L + i: token emitted[i], position L + i, slot
// X + L + i, and it sees the pairs [max(L + i + 1 - w, 0), L + i + 1) (its own included). A padding row
// i > A writes scratch slot i at position L with token 0 and sees only that slot. Slots are clamped to the
// cache. cache_rows are the slots' flat cache rows, order (b, i, h): (b * Hkv + h) * S + slot
// (eagle_ms/models/kv_cache.py ``flat_rows``).
extern "C" int ExtendInputs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *, void *) {
  static const char *const want[] = {"int32", "int32", "int32", "int32", "int32", "int32", "int32", "int32", "bool",
                                     "int32", "int32", "int32"};
  if (nparam != 12) return 1;
  if (!dtypes_are(dtypes, want, 12)) return 2;
  if (ndims[0] != 2 || ndims[3] != 1 || ndims[4] != 1) return 3;
  const int64_t b = shapes[0][0], rows = (shapes[0][1] - 1) / 2, width = shapes[3][0], heads = shapes[4][0];
  if (shapes[0][1] < 5 || shapes[0][1] % 2 == 0 || heads < 1 || element_count(ndims[1], shapes[1]) != b ||
      element_count(ndims[2], shapes[2]) != 3 || element_count(ndims[5], shapes[5]) != b * rows ||
      element_count(ndims[6], shapes[6]) != b * rows || element_count(ndims[7], shapes[7]) != b * rows * heads ||
      element_count(ndims[8], shapes[8]) != b * rows * width || element_count(ndims[9], shapes[9]) != b ||
      element_count(ndims[10], shapes[10]) != b || element_count(ndims[11], shapes[11]) != b)
    return 3;
  const int32_t *result = static_cast<const int32_t *>(params[0]);
  const int32_t *committed_len = static_cast<const int32_t *>(params[1]);
  const int32_t *settings = static_cast<const int32_t *>(params[2]);
  const int64_t scratch = settings[0], capacity = settings[1], window = settings[2];
  if (scratch < 0 || capacity < 1) return 3;
  int32_t *ids = static_cast<int32_t *>(params[5]), *positions = static_cast<int32_t *>(params[6]);
  int32_t *cache_rows = static_cast<int32_t *>(params[7]), *accepted_out = static_cast<int32_t *>(params[9]);
  int32_t *real_rows = static_cast<int32_t *>(params[10]), *next_length = static_cast<int32_t *>(params[11]);
  uint8_t *allowed = static_cast<uint8_t *>(params[8]);
  for (int64_t r = 0; r < b; ++r) {
    const int32_t *row = result + r * (2 * rows + 1);
    const int64_t accepted = row[0], start = committed_len[r];
    accepted_out[r] = static_cast<int32_t>(accepted);
    real_rows[r] = static_cast<int32_t>(std::max<int64_t>(accepted + 1, 0));
    next_length[r] = static_cast<int32_t>(start + accepted + 1);
    for (int64_t i = 0; i < rows; ++i) {
      const bool real = i <= accepted;
      const int64_t at = r * rows + i;
      const int64_t slot = std::min<int64_t>(real ? scratch + start + i : i, capacity - 1);
      ids[at] = real ? row[1 + i] : 0;
      positions[at] = static_cast<int32_t>(real ? start + i : start);
      for (int64_t h = 0; h < heads; ++h)
        cache_rows[at * heads + h] = static_cast<int32_t>((r * heads + h) * capacity + slot);
      const int64_t upto = real ? start + i + 1 : 0, lo = window > 0 ? std::max<int64_t>(upto - window, 0) : 0;
      uint8_t *keep = allowed + at * width;
      for (int64_t col = 0; col < width; ++col) {
        const int64_t pair = col - scratch;  // < 0: a scratch slot
        keep[col] = (pair >= lo && pair < upto) || col == slot ? 1 : 0;
      }
    }
  }
  return 0;
}

// RootPair(result [B, 2D+3] i32, logprob [B, D+1, K] f32, target_ids [B, D+1, K] i32, hidden [B, D+1, H] f32,
//          stored token [B] i32, stored logprob [B, K] f32, stored target_ids [B, K] i32, stored hidden [B, H] f32)
//   -> (token [B] i32, logprob [B, K] f32, target_ids [B, K] i32, hidden [B, H] f32).
// The new last pair of the draft (``DraftTreeStep.root_pair``): with A = result[:, 0] >= 0, extend row A's
// token (result column 1 + A), top-K and hidden; with A = -1 (no step yet) the stored pair unchanged.
// The stored pair (the draft's ``RootPairStore`` Parameters) is overwritten in place with the new one, so
// the graph needs no Assign per Parameter: nothing else in the draft graph reads them, and the next call
// reads what this one wrote.
extern "C" int RootPair(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *, void *) {
  static const char *const want[] = {"int32", "float32", "int32", "float32", "int32", "float32", "int32",
                                     "float32", "int32", "float32", "int32", "float32"};
  if (nparam != 12) return 1;
  if (!dtypes_are(dtypes, want, 12)) return 2;
  if (ndims[0] != 2 || ndims[1] != 3 || ndims[3] != 3) return 3;
  const int64_t b = shapes[0][0], rows = shapes[1][1], top = shapes[1][2], h = shapes[3][2];
  if (shapes[0][1] != 2 * rows + 1 || shapes[1][0] != b || element_count(ndims[2], shapes[2]) != b * rows * top ||
      shapes[3][0] != b || shapes[3][1] != rows || element_count(ndims[4], shapes[4]) != b ||
      element_count(ndims[5], shapes[5]) != b * top || element_count(ndims[6], shapes[6]) != b * top ||
      element_count(ndims[7], shapes[7]) != b * h || element_count(ndims[8], shapes[8]) != b ||
      element_count(ndims[9], shapes[9]) != b * top || element_count(ndims[10], shapes[10]) != b * top ||
      element_count(ndims[11], shapes[11]) != b * h)
    return 3;
  const int32_t *result = static_cast<const int32_t *>(params[0]);
  const float *logprob = static_cast<const float *>(params[1]), *hidden = static_cast<const float *>(params[3]);
  const int32_t *target_ids = static_cast<const int32_t *>(params[2]);
  const int32_t *kept_token = static_cast<const int32_t *>(params[4]);
  const float *kept_logprob = static_cast<const float *>(params[5]), *kept_hidden = static_cast<const float *>(params[7]);
  const int32_t *kept_ids = static_cast<const int32_t *>(params[6]);
  int32_t *token = static_cast<int32_t *>(params[8]), *ids = static_cast<int32_t *>(params[10]);
  float *lp = static_cast<float *>(params[9]), *hid = static_cast<float *>(params[11]);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t a = result[r * (2 * rows + 1)];
    if (a >= rows || a < -1) return 3;
    const bool fresh = a >= 0;
    token[r] = fresh ? result[r * (2 * rows + 1) + 1 + a] : kept_token[r];
    std::memcpy(lp + r * top, fresh ? logprob + (r * rows + a) * top : kept_logprob + r * top, sizeof(float) * top);
    std::memcpy(ids + r * top, fresh ? target_ids + (r * rows + a) * top : kept_ids + r * top, sizeof(int32_t) * top);
    std::memcpy(hid + r * h, fresh ? hidden + (r * rows + a) * h : kept_hidden + r * h, sizeof(float) * h);
  }
  std::memcpy(params[4], token, sizeof(int32_t) * b);  // the stored pair, in place
  std::memcpy(params[5], lp, sizeof(float) * b * top);
  std::memcpy(params[6], ids, sizeof(int32_t) * b * top);
  std::memcpy(params[7], hid, sizeof(float) * b * h);
  return 0;
}

// TreeFinish(scores [B, C] f32, ints [B, 3, C] i32, root_token [B] i32, committed_len [B] i32,
//            layout [D+1, N] i32 (its shape only, as TreeStart's))
//   -> (tokens [B, N] i32, parent [B, N] i32, depth [B, N] i32, valid [B, N] bool, ancestors [B, D+1, N] i32,
//       position_ids [B, N] i32, cache_slots [B, N] i32, tree_mask [B, N, N] bool, paths [B, P, D+1] i32,
//       path_lengths [B, P] i32, num_paths [B] i32, node_scores [B, N] f32)
// with N = M + 1 and P = M (``TreeGrowth.finish`` + ``tensors``): keep the M best
// valid candidates; number them in depth-first preorder from the dummy root 0, children best first (score
// descending, ties lower id: ``chain_first``); then the tensors of eagle_ms/tree.py ``tensorize`` at
// committed length L. Nodes past the kept ones are padding: token 0, parent 0, depth 0, invalid, score 0.
extern "C" int TreeFinish(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *, void *) {
  static const char *const want[] = {"float32", "int32", "int32", "int32", "int32", "int32", "int32", "int32",
                                     "bool", "int32", "int32", "int32", "bool", "int32", "int32", "int32", "float32"};
  if (nparam != 17) return 1;
  if (!dtypes_are(dtypes, want, 17)) return 2;
  enum { kScores, kInts, kRoot, kLength, kLayout, kTokens, kParents, kDepth, kValid, kAncestors, kPositions,
         kSlots, kMask, kPaths, kPathLengths, kNumPaths, kNodeScores };
  const int64_t b = shapes[kScores][0], c = shapes[kScores][ndims[kScores] - 1];
  const bool layout_2d = ndims[kLayout] == 2;
  const int64_t levels = layout_2d ? shapes[kLayout][0] : 0, n = layout_2d ? shapes[kLayout][1] : 0, m = n - 1;
  const auto size = [&](int i) { return element_count(ndims[i], shapes[i]); };
  if (n < 1 || levels < 1 || size(kScores) != b * c || size(kInts) != b * 3 * c || size(kRoot) != b ||
      size(kLength) != b || size(kTokens) != b * n || size(kAncestors) != b * levels * n ||
      size(kMask) != b * n * n || size(kPaths) != b * m * levels || size(kNodeScores) != b * n)
    return 3;
  const float *cand_scores = static_cast<const float *>(params[kScores]);
  const int32_t *cand_ints = static_cast<const int32_t *>(params[kInts]);
  const int32_t *root_token = static_cast<const int32_t *>(params[kRoot]);
  const int32_t *committed_len = static_cast<const int32_t *>(params[kLength]);
  int32_t *tokens = static_cast<int32_t *>(params[kTokens]), *parent = static_cast<int32_t *>(params[kParents]);
  int32_t *depth = static_cast<int32_t *>(params[kDepth]);
  uint8_t *valid = static_cast<uint8_t *>(params[kValid]);
  int32_t *ancestors = static_cast<int32_t *>(params[kAncestors]);
  int32_t *position_ids = static_cast<int32_t *>(params[kPositions]);
  int32_t *cache_slots = static_cast<int32_t *>(params[kSlots]);
  uint8_t *tree_mask = static_cast<uint8_t *>(params[kMask]);
  int32_t *paths = static_cast<int32_t *>(params[kPaths]), *path_lengths = static_cast<int32_t *>(params[kPathLengths]);
  int32_t *num_paths = static_cast<int32_t *>(params[kNumPaths]);
  float *node_scores = static_cast<float *>(params[kNodeScores]);
  std::vector<int32_t> node_of(c), cand_depth(c), cand_of(n), stack;
  std::vector<std::vector<int32_t>> children(c + 1);  // [0] = the root's, [1 + id] = candidate id's
  std::vector<uint8_t> has_child(n);
  for (int64_t r = 0; r < b; ++r) {
    const float *s = cand_scores + r * c;
    const int32_t *tok = cand_ints + r * 3 * c, *par = tok + c, *ok = par + c;
    std::vector<int32_t> alive;
    for (int32_t i = 0; i < c; ++i) {
      if (par[i] >= i || par[i] < -1) return 3;  // parents precede children
      cand_depth[i] = par[i] < 0 ? 1 : cand_depth[par[i]] + 1;
      if (ok[i]) alive.push_back(i);
    }
    const std::vector<int32_t> order = rank_order(s, alive);
    const int64_t kept = std::min<int64_t>(m, static_cast<int64_t>(order.size()));
    for (auto &list : children) list.clear();
    std::fill(node_of.begin(), node_of.end(), 0);
    for (int64_t q = 0; q < kept; ++q) children[par[order[q]] + 1].push_back(order[q]);  // best first
    int32_t next = 0;  // preorder: the best child's subtree first, so the best chain is nodes 1..d
    stack.assign(children[0].rbegin(), children[0].rend());
    while (!stack.empty()) {
      const int32_t cand = stack.back();
      stack.pop_back();
      node_of[cand] = ++next;
      cand_of[next] = cand;
      stack.insert(stack.end(), children[cand + 1].rbegin(), children[cand + 1].rend());
    }
    if (next != kept) return 3;  // a kept candidate whose parent was not kept: no tree
    const int32_t length = committed_len[r];
    int32_t *tk = tokens + r * n, *pa = parent + r * n, *de = depth + r * n, *an = ancestors + r * levels * n;
    uint8_t *va = valid + r * n, *mask = tree_mask + r * n * n;
    float *sc = node_scores + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const bool real = i >= 1 && i <= kept;
      const int32_t cand = real ? cand_of[i] : 0;
      tk[i] = real ? tok[cand] : (i == 0 ? root_token[r] : 0);
      pa[i] = real && par[cand] >= 0 ? node_of[par[cand]] : 0;
      de[i] = real ? cand_depth[cand] : 0;
      va[i] = i <= kept ? 1 : 0;
      sc[i] = real ? s[cand] : 0.0f;
      position_ids[r * n + i] = length + de[i];
      cache_slots[r * n + i] = length + static_cast<int32_t>(i);
    }
    std::fill(has_child.begin(), has_child.end(), 0);
    std::fill(mask, mask + n * n, 0);
    for (int64_t i = 0; i < n; ++i) {
      int32_t a = static_cast<int32_t>(i);
      for (int64_t l = 0; l < levels; ++l) {  // A[0, i] = i, A[l+1, i] = parent[A[l, i]]
        an[l * n + i] = a;
        if (va[i]) mask[i * n + a] = 1;  // ancestors-or-self of a valid node (all valid)
        a = pa[a];
      }
      mask[i * n + i] = 1;
      if (i >= 1 && va[i]) has_child[pa[i]] = 1;
    }
    int32_t leaves = 0;
    int32_t *rows = paths + r * m * levels, *lengths = path_lengths + r * m;
    std::fill(rows, rows + m * levels, 0);
    std::fill(lengths, lengths + m, 0);
    for (int64_t q = 0; q < n; ++q) {  // root-to-leaf rows in ascending leaf id: row[i] = A[max(d - i, 0), q]
      if (!va[q] || has_child[q]) continue;
      if (leaves == m || de[q] >= levels) return 3;
      for (int64_t i = 0; i < levels; ++i) rows[leaves * levels + i] = an[std::max<int64_t>(de[q] - i, 0) * n + q];
      lengths[leaves++] = de[q] + 1;
    }
    num_paths[r] = leaves;
  }
  return 0;
}
