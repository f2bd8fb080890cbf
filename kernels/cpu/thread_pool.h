// kernels/cpu/thread_pool.h: the CPU kernels' worker threads. Idle workers poll for 50 us, then block
// on a condition variable instead of spinning for milliseconds as OpenMP's do: on a loaded or
// shared machine a spinning waiter burns the time slice the thread it waits for needs (measured on
// 2 shared cores: 0.4 tok/s with OpenMP's default wait policy, ~19 with a blocking one). The short
// poll catches the next op of a decode step without a futex sleep and wake-up per op (a
// parallel_for of ~5 us of work: 70 us per call when every call woke a sleeping worker, 7 us
// polling; SmolLM2 decode 58 -> 85 tok/s).
//
// Thread safety: parallel_for may be called from any thread; calls are serialised, and a call made
// from inside a task runs inline on the calling worker.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera::kernels::cpu {

// Number of threads parallel_for uses (the caller included). <= 0: the hardware concurrency.
void set_num_threads(int num_threads);
int num_threads();

// Runs body(begin, end) over [0, n) split into chunks of at least `grain` items, spread over the
// threads (dynamic: a thread that finishes early takes the next chunk). Returns when all are done.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace tessera::kernels::cpu
