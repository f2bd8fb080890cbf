// ConnectionThreads: every connection gets a thread at once up to the cap, past it they wait, and
// idle threads beyond the warm ones end after their linger.
#include "server/http/connection_threads.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace tessera {
namespace {

using namespace std::chrono_literals;

// Polls `done` for up to `limit`; true when it held.
template <typename Predicate>
bool eventually(Predicate done, std::chrono::milliseconds limit = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(ConnectionThreads, EveryConnectionGetsAThreadAtOnceUpToTheCapAndIdleOnesEnd) {
  ConnectionThreads pool(/*max_threads=*/64, /*keep_idle=*/2, /*linger=*/200ms);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> started{0};
  // 64 connections that hold their thread (streams) all run at once.
  for (int i = 0; i < 64; ++i) {
    pool.enqueue([&, released] {
      ++started;
      released.wait();
    });
  }
  ASSERT_TRUE(eventually([&] { return started.load() == 64; })) << started.load() << " of 64 running";
  EXPECT_EQ(pool.threads(), 64u);
  // The 65th waits for a thread.
  std::atomic<bool> late_ran{false};
  pool.enqueue([&] { late_ran = true; });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(late_ran.load());
  EXPECT_EQ(pool.threads(), 64u);
  release.set_value();
  ASSERT_TRUE(eventually([&] { return late_ran.load(); }));
  // Idle for longer than the linger: all but the 2 warm threads end.
  ASSERT_TRUE(eventually([&] { return pool.threads() == 2; })) << pool.threads() << " threads left";
  // And new work still runs, on a warm thread or a new one.
  std::atomic<int> after{0};
  for (int i = 0; i < 5; ++i) pool.enqueue([&] { ++after; });
  ASSERT_TRUE(eventually([&] { return after.load() == 5; }));
  pool.shutdown();
  EXPECT_EQ(pool.threads(), 0u);
}

TEST(ConnectionThreads, ShutdownRunsWhatIsQueuedThenJoins) {
  std::atomic<int> ran{0};
  {
    ConnectionThreads pool(/*max_threads=*/1, /*keep_idle=*/0, /*linger=*/10ms);
    for (int i = 0; i < 20; ++i) {
      pool.enqueue([&] {
        std::this_thread::sleep_for(1ms);
        ++ran;
      });
    }
    pool.shutdown();
    EXPECT_EQ(ran.load(), 20);
    pool.enqueue([&] { ++ran; });  // after shutdown: dropped, not run on a thread nobody joins
  }
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace tessera
