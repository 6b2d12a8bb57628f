// Helpers shared by the CPU kernel sources (cpu_kernels.cc, tree_kernels.cc, verify_kernels.cc), which
// eagle_ms/models/cpu_kernels.py compiles into one library. The helpers are ``static inline``: every
// translation unit gets its own private copy, and the library exports none of them.
//
// Calling convention of every kernel (MindSpore AOT, CPU): params holds the inputs, then the outputs;
// ndims/shapes/dtypes describe each; every tensor is contiguous row-major.
#ifndef EAGLE_MS_MODELS_KERNEL_COMMON_H_
#define EAGLE_MS_MODELS_KERNEL_COMMON_H_

#include <cstdint>
#include <cstring>

// The number of elements of a tensor with ``ndim`` dimensions of sizes ``shape``.
static inline int64_t element_count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// True when the first ``n`` tensors have exactly the dtypes ``want`` (MindSpore's names, e.g. "int32").
static inline bool dtypes_are(const char **dtypes, const char *const *want, int n) {
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(dtypes[i], want[i]) != 0) return false;
  }
  return true;
}

// True when all ``nparam`` tensors are float32.
static inline bool all_float32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return false;
  }
  return true;
}

#endif  // EAGLE_MS_MODELS_KERNEL_COMMON_H_
