// The EAGLE-2 tree bookkeeping per batch row, shared by the tree kernels (tree_kernels.cc: one kernel per
// depth) and the draft tree kernel (draft_kernels.cc: every depth in one kernel, with the exact early stop),
// so that both grow the same tree from the same log-probs. Candidate tables and frontier as tree_kernels.cc
// describes them.
#ifndef EAGLE_MS_MODELS_TREE_MATH_H_
#define EAGLE_MS_MODELS_TREE_MATH_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace {

enum IntRow { kToken = 0, kParent = 1, kValid = 2 };

// Indices 0..n-1 ordered by (score descending, index ascending): std::stable_sort keeps equal scores in
// index order. Only ``want`` leading entries are needed; n is at most a few hundred.
std::vector<int32_t> rank_order(const float *scores, const std::vector<int32_t> &ids) {
  std::vector<int32_t> order(ids);
  std::stable_sort(order.begin(), order.end(), [scores](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  return order;
}

// Depth 1 of one batch row (``TreeStart``): candidates 0..k-1 are the root pair's first k top-K entries
// (root_lp, root_ids: its K >= k best, descending), score min(log p, 0), parent -1, valid; every other of
// the c slots is empty (score 0, token 0, parent -1, invalid). s [c], ints [3, c]; the frontier [k] each.
void tree_start_row(const float *root_lp, const int32_t *root_ids, int64_t k, int64_t c, float *s, int32_t *ints,
                    float *front_scores, int32_t *front_ids, int32_t *front_tokens) {
  int32_t *tok = ints + kToken * c, *par = ints + kParent * c, *valid = ints + kValid * c;
  std::fill(s, s + c, 0.0f);
  std::fill(tok, tok + c, 0);
  std::fill(par, par + c, -1);
  std::fill(valid, valid + c, 0);
  for (int64_t i = 0; i < k; ++i) {
    const float lp = root_lp[i];
    s[i] = lp < 0.0f ? lp : 0.0f;
    tok[i] = root_ids[i];
    valid[i] = 1;
    front_scores[i] = s[i];
    front_ids[i] = static_cast<int32_t>(i);
    front_tokens[i] = tok[i];
  }
}

// One expansion depth of one batch row (``TreeGrow``), tables s [c] / ints [3, c] updated in place: frontier
// row r (fs, fid: the old frontier) gets children first + r*k + col with score fs[r] + min(logprob[r, col], 0)
// (logprob, target_ids [k, top]), token target_ids[r, col], parent fid[r], valid iff the frontier is and the
// best frontier score >= cut. Writes the new frontier (k best children, score descending, ties lower id) and
// parent_rows (their rows r). The old and new frontier must not overlap. False (nothing written) when fid[0]
// is not a candidate of an earlier depth.
bool tree_grow_row(float *s, int32_t *ints, int64_t c, const float *fs, const int32_t *fid, const float *logprob,
                   const int32_t *target_ids, int64_t top, int64_t k, int32_t first, float cut, float *front_scores,
                   int32_t *front_ids, int32_t *front_tokens, int32_t *parent_rows) {
  if (fid[0] < 0 || fid[0] >= first) return false;
  int32_t *tok = ints + kToken * c, *par = ints + kParent * c, *valid = ints + kValid * c;
  const float best = *std::max_element(fs, fs + k);
  const int32_t alive = valid[fid[0]] != 0 && best >= cut ? 1 : 0;
  for (int64_t row = 0; row < k; ++row) {
    for (int64_t col = 0; col < k; ++col) {
      const float lp = logprob[row * top + col];
      const int64_t id = first + row * k + col;
      s[id] = fs[row] + (lp < 0.0f ? lp : 0.0f);
      tok[id] = target_ids[row * top + col];
      par[id] = fid[row];
      valid[id] = alive;
    }
  }
  std::vector<int32_t> children(k * k);
  for (int64_t i = 0; i < k * k; ++i) children[i] = static_cast<int32_t>(i);
  const std::vector<int32_t> order = rank_order(s + first, children);
  for (int64_t q = 0; q < k; ++q) {
    const int32_t child = order[q];
    front_scores[q] = s[first + child];
    front_ids[q] = first + child;
    front_tokens[q] = tok[first + child];
    parent_rows[q] = static_cast<int32_t>(child / k);
  }
  return true;
}

// True when no further depth can change the final top-``budget`` (eagle_ms/drafting.py ``_can_stop``, the
// exact early stop): the frontier is dead (a min_path_prob cut made its children invalid), or at least
// ``budget`` valid candidates of the first ``created`` already score >= the best frontier score. A later
// candidate descends from the frontier, so its score is <= that bound (log p <= 0, float32 rounding is
// monotone), and it is created after every existing one: on a tie it ranks below them.
// Used by the draft tree kernel (draft_kernels.cc ``DraftTree``) before each depth.
bool tree_can_stop(const float *s, const int32_t *valid, int64_t created, const float *front_scores,
                   const int32_t *front_ids, int64_t k, int64_t budget, std::vector<float> &scratch) {
  if (valid[front_ids[0]] == 0) return true;
  scratch.clear();
  for (int64_t i = 0; i < created; ++i) {
    if (valid[i]) scratch.push_back(s[i]);
  }
  if (static_cast<int64_t>(scratch.size()) < budget) return false;
  std::nth_element(scratch.begin(), scratch.begin() + (budget - 1), scratch.end(), std::greater<float>());
  return scratch[budget - 1] >= *std::max_element(front_scores, front_scores + k);
}

}  // namespace

#endif  // EAGLE_MS_MODELS_TREE_MATH_H_
