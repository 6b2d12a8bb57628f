// Work split over the calling thread and one persistent helper thread, for the draft kernels
// (draft_kernels.cc). MindSpore's CPU runtime runs one kernel at a time on one core; while a draft kernel runs,
// the machine's other core is idle. ``split_work(count, fn)`` runs fn(0) .. fn(count-1), each exactly once,
// on the caller and on the helper: both take the next unclaimed chunk until none is left (work stealing), so
// a helper that is asleep, descheduled or busy with another caller costs nothing but its share.
//
// Same bits: callers split only work whose results do not depend on which thread computes them (disjoint
// output columns of a matmul), so the output is identical with or without the helper.
//
// The helper spins for about kSpinRounds polls after a job (the next job of a draft kernel follows within
// microseconds), then sleeps on a condition variable until the next call. One caller at a time uses it; a
// concurrent caller runs its chunks alone. After fork() the child starts a helper of its own. The environment
// variable EAGLE_MS_KERNEL_THREADS=1 (read at every call) runs every chunk on the caller.
#ifndef EAGLE_MS_MODELS_WORK_SPLIT_H_
#define EAGLE_MS_MODELS_WORK_SPLIT_H_

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

namespace work_split {

constexpr int64_t kSpinRounds = 200000;  // polls (each a pause) before the helper sleeps: ~0.1-1 ms

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One job: chunks [0, count) of ``fn``; ``next`` is the next unclaimed chunk, ``done`` the chunks finished.
struct Job {
  const std::function<void(int64_t)> *fn = nullptr;
  int64_t count = 0;
  std::atomic<int64_t> next{0}, done{0};
};

class Helper {
 public:
  Helper() : thread_([this] { loop(); }) { thread_.detach(); }

  // Runs fn(0..count-1) on the caller and the helper; returns when every chunk is done. False when another
  // caller holds the helper (nothing was run).
  bool run(const std::function<void(int64_t)> &fn, int64_t count) {
    std::unique_lock<std::mutex> owner(owner_, std::try_to_lock);
    if (!owner.owns_lock()) return false;
    job_.fn = &fn;
    job_.count = count;
    job_.next.store(0);
    job_.done.store(0);
    {
      std::lock_guard<std::mutex> lock(wake_);
      published_.store(true);
      epoch_.fetch_add(1);
    }
    wake_cv_.notify_one();
    work(job_);
    while (job_.done.load(std::memory_order_acquire) < count) cpu_relax();
    published_.store(false);                  // no new entry into this job ...
    while (inside_.load() != 0) cpu_relax();  // ... and none still inside it
    return true;
  }

 private:
  static void work(Job &job) {
    for (int64_t i = job.next.fetch_add(1); i < job.count; i = job.next.fetch_add(1)) {
      (*job.fn)(i);
      job.done.fetch_add(1, std::memory_order_release);
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      int64_t polls = 0;
      while (epoch_.load() == seen && polls < kSpinRounds) {
        cpu_relax();
        ++polls;
      }
      if (epoch_.load() == seen) {
        std::unique_lock<std::mutex> lock(wake_);
        wake_cv_.wait(lock, [&] { return epoch_.load() != seen; });
      }
      seen = epoch_.load();
      inside_.fetch_add(1);  // enter only a job still published (run() clears it, then waits for inside_ 0)
      if (published_.load()) work(job_);
      inside_.fetch_sub(1);
    }
  }

  Job job_;
  std::mutex owner_, wake_;
  std::condition_variable wake_cv_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> published_{false};
  std::atomic<int> inside_{0};
  std::thread thread_;
};

// The process's helper (a new one after fork(): the parent's thread does not exist in the child). Never
// destroyed: the detached thread may be waiting on it when the process exits.
inline Helper *process_helper() {
  static pid_t owner_pid = 0;
  static Helper *helper = nullptr;
  static std::mutex create;
  std::lock_guard<std::mutex> lock(create);
  if (helper == nullptr || owner_pid != getpid()) {
    helper = new Helper();
    owner_pid = getpid();
  }
  return helper;
}

inline bool helper_enabled() {
  const char *threads = std::getenv("EAGLE_MS_KERNEL_THREADS");
  return threads == nullptr || std::strcmp(threads, "1") != 0;
}

// fn(0) .. fn(count-1), each once, split over the caller and the helper (module comment).
inline void split_work(int64_t count, const std::function<void(int64_t)> &fn) {
  if (count > 1 && helper_enabled() && process_helper()->run(fn, count)) return;
  for (int64_t i = 0; i < count; ++i) fn(i);
}

}  // namespace work_split

#endif  // EAGLE_MS_MODELS_WORK_SPLIT_H_
