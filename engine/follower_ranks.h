// engine/follower_ranks.h: FollowerRanks, the ranks after the first of a tensor-parallel model. The
// first rank's Executor (the leader) runs each forward on its own thread and, on a thread per
// follower, has every follower run the same forward on its shard at the same time: the ranks meet
// in the graph's all-reduces. Only the leader samples.
//
// Thread safety: one thread (the leader's) calls start() and wait() in turn.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/model.h"

namespace tessera {

class Executor;

// One rank of a tensor-parallel model: its shard of the graph, on the backend that holds it.
struct RankShard {
  CausalLm* model = nullptr;
  Backend* backend = nullptr;
};

// One model loaded on every backend of a group, shard r on backends[r] (one shard: not sharded).
struct ShardedModel {
  std::vector<std::unique_ptr<CausalLm>> shards;
  std::vector<RankShard> followers;  // shards 1, 2, ... with their backends, for Executor

  // `load(backend)` builds the graph on one backend (the graph loads the backend's rank's shard).
  static ShardedModel load(std::span<const std::unique_ptr<Backend>> backends,
                           const std::function<std::unique_ptr<CausalLm>(Backend&)>& load);
  CausalLm& first() const { return *shards.front(); }
};

class FollowerRanks {
 public:
  // An Executor per follower with a KV cache of the leader's shape (the pool is the leader's: the
  // followers hold their heads' share of the same blocks), and a thread each. `leader` is the first
  // rank's backend: a failing follower aborts its collectives too.
  FollowerRanks(std::span<const RankShard> followers, Backend& leader, int32_t num_blocks, int32_t block_size);
  ~FollowerRanks();  // ends the threads (after the work under way)
  FollowerRanks(const FollowerRanks&) = delete;
  FollowerRanks& operator=(const FollowerRanks&) = delete;

  // Each follower runs work(its executor) on its thread; returns at once. What `work` reads must
  // stay alive until wait() returns.
  void start(std::function<void(Executor&)> work);
  // Waits for every follower's work; rethrows the first follower's error. A follower that fails
  // aborts every rank's collectives first, so that no rank waits forever in an all-reduce.
  void wait();
  // The leader's own forward failed: aborts every rank's collectives, then waits for the followers.
  // Returns the first follower's error, if one failed: then it is the cause (the leader's forward
  // failed on the group it aborted), and the one to report.
  std::exception_ptr abort_and_wait();

 private:
  static constexpr std::chrono::milliseconds kPollBeforeSleep{5};
  struct Worker;
  void serve(Worker& worker);
  // Aborts every rank's collectives, the first time only; `cause`: the follower error that made it.
  void abort_all(std::exception_ptr cause);

  Backend& leader_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex abort_mutex_;
  bool aborted_ = false;
  std::exception_ptr abort_cause_;  // the follower error that aborted the group, if one did
};

}  // namespace tessera
