// Threads: different contexts compute at once; one context entered by two threads answers
// CONTEXT_BUSY to the second and never computes wrongly; a forked child computes with the
// contexts it inherited.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "api_helpers.hpp"

using namespace api_test;

namespace {

// The exit status of a child process, or -1 when it has not ended after `limit` (it is killed
// then): a child that hangs must fail the test, not stall the suite.
int wait_for_child(pid_t child, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Shape thread_shape() {
  Shape s;
  s.batch = 2;
  s.seqlen_q = 33;
  s.seqlen_k = 47;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 32;
  return s;
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("two contexts on two threads compute at once, as they do one after the other") {
    Context ctx_a, ctx_b;
    const Shape s = thread_shape();
    Forward a(s, 100), b(s, 200);
    // Sequential results first.
    REQUIRE_OK(a.run(ctx_a));
    REQUIRE_OK(b.run(ctx_b));
    const std::vector<float> want_a = a.out, want_b = b.out;
    CHECK(max_error(a.tout, reference_forward(a.tq, a.tk, a.tv, 0.0, false).out) <= kFp32Tolerance);
    CHECK(max_error(b.tout, reference_forward(b.tq, b.tk, b.tv, 0.0, false).out) <= kFp32Tolerance);

    constexpr int kRounds = 40;
    std::atomic<int> go{0};
    auto worker = [&](flashattn_context_t ctx, Forward* f, const std::vector<float>* want,
                      int* failures, std::string* first_failure) {
      go.fetch_add(1);
      while (go.load() < 2) {
      }  // start together
      for (int i = 0; i < kRounds; ++i) {
        poison(f->out);
        const flashattn_status_t st = f->run(ctx);
        if (st != FLASHATTN_SUCCESS || differs(f->out, *want)) {
          if ((*failures)++ == 0) {
            *first_failure = std::string(flashattn_status_string(st)) + " " + flashattn_last_error();
          }
        }
      }
    };
    int failures_a = 0, failures_b = 0;
    std::string first_a, first_b;
    std::thread ta(worker, static_cast<flashattn_context_t>(ctx_a), &a, &want_a, &failures_a, &first_a);
    std::thread tb(worker, static_cast<flashattn_context_t>(ctx_b), &b, &want_b, &failures_b, &first_b);
    ta.join();
    tb.join();
    INFO(first_a);
    INFO(first_b);
    CHECK(failures_a == 0);
    CHECK(failures_b == 0);
  }

  TEST_CASE("several threads, each its own context, hammer forward and backward: results as alone") {
    // Different shapes per thread (GQA, causal, uneven lengths), forward then backward on the
    // forward's output; every result must equal, bit for bit, what the same context computed
    // with no other thread running.
    constexpr int kThreads = 4;
    constexpr int kRounds = 12;
    struct Job {
      Shape shape;
      bool causal;
    };
    const Job jobs[kThreads] = {
        {{2, 33, 47, 4, 2, 32}, false},
        {{1, 64, 64, 2, 2, 64}, true},
        {{3, 17, 9, 6, 1, 16}, true},
        {{1, 100, 37, 2, 1, 40}, false},
    };
    struct Result {
      std::vector<float> out, lse, dq, dk, dv;
      bool operator==(const Result& o) const {
        auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
        };
        return same(out, o.out) && same(lse, o.lse) && same(dq, o.dq) && same(dk, o.dk) &&
               same(dv, o.dv);
      }
    };
    std::vector<Context> contexts(kThreads);
    std::vector<Backward> work;
    std::vector<flashattn_options_t> opts(kThreads);
    for (int i = 0; i < kThreads; ++i) work.emplace_back(jobs[i].shape, 300 + 10 * i);
    auto run = [&](int i, Result* r) {
      Backward& w = work[i];
      poison(w.out);
      poison(w.lse);
      poison(w.dq);
      poison(w.dk);
      poison(w.dv);
      const flashattn_status_t a = static_cast<Forward&>(w).run(contexts[i], &opts[i]);
      const flashattn_status_t b = w.run(contexts[i], &opts[i]);
      *r = Result{w.out, w.lse, w.dq, w.dk, w.dv};
      return a == FLASHATTN_SUCCESS && b == FLASHATTN_SUCCESS;
    };
    std::vector<Result> alone(kThreads);
    for (int i = 0; i < kThreads; ++i) {
      REQUIRE_OK(flashattn_options_init(&opts[i]));
      opts[i].causal = jobs[i].causal ? 1 : 0;
      REQUIRE(run(i, &alone[i]));
      CHECK(max_error(work[i].tout, reference_forward(work[i].tq, work[i].tk, work[i].tv, 0.0,
                                                      jobs[i].causal).out) <= kFp32Tolerance);
    }
    std::atomic<int> go{0};
    std::vector<int> failures(kThreads, 0);
    std::vector<std::string> first(kThreads);
    auto worker = [&](int i) {
      go.fetch_add(1);
      while (go.load() < kThreads) {
      }  // start together
      for (int r = 0; r < kRounds; ++r) {
        Result got;
        const bool ok = run(i, &got);
        if ((!ok || !(got == alone[i])) && failures[i]++ == 0) {
          first[i] = ok ? "results differ" : std::string(flashattn_last_error());
        }
      }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) {
      INFO("thread " << i << ": " << first[i]);
      CHECK(failures[i] == 0);
    }
  }

  TEST_CASE("one context raced by two threads: SUCCESS or CONTEXT_BUSY, and right results") {
    Context ctx;
    const Shape s = thread_shape();
    Forward a(s, 300), b(s, 400);
    REQUIRE_OK(a.run(ctx));
    REQUIRE_OK(b.run(ctx));
    const std::vector<float> want_a = a.out, want_b = b.out;

    // Each thread computes until it has succeeded kWanted times, going back in when turned away.
    constexpr int kWanted = 25;
    constexpr long kMaxAttempts = 10000000;  // a bound instead of a hang if BUSY never clears
    struct Tally {
      int ok = 0, busy = 0, other = 0, wrong = 0, busy_but_written = 0;
      std::string other_message, busy_message;
    };
    std::atomic<int> go{0};
    auto worker = [&](Forward* f, const std::vector<float>* want, Tally* t) {
      go.fetch_add(1);
      while (go.load() < 2) {
      }
      for (long i = 0; t->ok < kWanted && i < kMaxAttempts; ++i) {
        poison(f->out);
        const flashattn_status_t st = f->run(ctx);
        if (st == FLASHATTN_SUCCESS) {
          ++t->ok;
          if (differs(f->out, *want)) ++t->wrong;
        } else if (st == FLASHATTN_ERROR_CONTEXT_BUSY) {
          ++t->busy;
          t->busy_message = flashattn_last_error();
          if (!all_poison(f->out)) ++t->busy_but_written;
          std::this_thread::yield();
        } else {
          ++t->other;
          t->other_message = std::string(flashattn_status_string(st)) + " " + flashattn_last_error();
        }
      }
    };
    Tally ta_, tb_;
    std::thread ta(worker, &a, &want_a, &ta_);
    std::thread tb(worker, &b, &want_b, &tb_);
    ta.join();
    tb.join();
    MESSAGE("thread A: " << ta_.ok << " ok, " << ta_.busy << " busy; thread B: " << tb_.ok
                         << " ok, " << tb_.busy << " busy");
    for (const Tally* t : {&ta_, &tb_}) {
      INFO(t->other_message);
      CHECK(t->other == 0);
      CHECK(t->wrong == 0);
      CHECK(t->busy_but_written == 0);
      CHECK(t->ok == kWanted);
      if (t->busy > 0) CHECK(contains(t->busy_message, "in use by another thread"));
    }
    // Each thread was turned away at least once, or the two never met: say which.
    if (ta_.busy + tb_.busy == 0) MESSAGE("the threads never met inside the context this run");
  }

  TEST_CASE("a second thread entering a busy context gets CONTEXT_BUSY and nothing happens") {
    // Thread A keeps the context busy with large buffer writes; thread B calls in until it has
    // been turned away at least once. Every answer either thread gets is SUCCESS or BUSY.
    Context ctx;
    constexpr size_t kBig = size_t(32) << 20;
    flashattn_buffer_t big = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&big, ctx, kBig));
    std::vector<unsigned char> src(kBig, 0x5A);

    std::atomic<bool> stop{false};
    std::atomic<int> a_other{0}, a_writes{0};
    std::thread a([&] {
      // Bounded by completed writes (B, preempted inside a call, may turn A away many times),
      // so that a broken busy check fails the test instead of hanging it.
      for (long attempt = 0; a_writes.load() < 500 && attempt < 10000000 && !stop.load(); ++attempt) {
        const flashattn_status_t st = flashattn_buffer_write(big, 0, src.data(), kBig);
        if (st == FLASHATTN_SUCCESS) {
          a_writes.fetch_add(1);
        } else if (st == FLASHATTN_ERROR_CONTEXT_BUSY) {
          std::this_thread::yield();
        } else {
          a_other.fetch_add(1);
        }
      }
      stop.store(true);
    });

    int busy = 0, ok = 0, other = 0;
    std::string busy_message, other_message;
    std::vector<float> probe(16, -1.0f);
    flashattn_buffer_t small = nullptr;
    for (int i = 0; !stop.load(); ++i) {
      flashattn_status_t st;
      switch (i % 4) {
        case 0: st = flashattn_context_synchronize(ctx); break;
        case 1: st = flashattn_context_set_num_threads(ctx, 0); break;
        case 2:
          st = flashattn_buffer_read(big, 0, probe.data(), probe.size() * sizeof(float));
          if (st == FLASHATTN_ERROR_CONTEXT_BUSY) {
            for (float x : probe) {
              if (x != -1.0f) ++other;  // a refused read must not touch dst
            }
          } else {
            std::fill(probe.begin(), probe.end(), -1.0f);
          }
          break;
        default:
          st = flashattn_buffer_create(&small, ctx, 64);
          if (st == FLASHATTN_SUCCESS) {
            flashattn_buffer_destroy(small);
            small = nullptr;
          }
          break;
      }
      if (st == FLASHATTN_ERROR_CONTEXT_BUSY) {
        ++busy;
        busy_message = flashattn_last_error();
        if (busy >= 20) stop.store(true);
      } else if (st == FLASHATTN_SUCCESS) {
        ++ok;
      } else {
        ++other;
        other_message = std::string(flashattn_status_string(st)) + " " + flashattn_last_error();
      }
    }
    a.join();
    CHECK(small == nullptr);  // never set by a refused create
    INFO(other_message);
    CHECK(other == 0);
    CHECK(a_other.load() == 0);
    CHECK(busy > 0);
    CHECK(contains(busy_message, "the context is in use by another thread"));
    MESSAGE(a_writes.load() << " writes on A; B: " << busy << " busy, " << ok << " ok");
    // Unused now: every call succeeds again.
    EXPECT_OK(flashattn_context_synchronize(ctx));
    flashattn_buffer_destroy(big);
  }

  TEST_CASE("after fork(), the child computes with the contexts and buffers it inherited") {
    // The parent's pool has started its workers; the child has none of those threads.
    Context ctx;
    REQUIRE_OK(flashattn_context_set_num_threads(ctx, 3));
    const Shape s = thread_shape();
    Forward want(s, 300);
    REQUIRE_OK(want.run(ctx));
    flashattn_buffer_t buf = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&buf, ctx, want.out.size() * sizeof(float)));
    REQUIRE_OK(flashattn_buffer_write(buf, 0, want.out.data(), want.out.size() * sizeof(float)));

    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // In the child: no doctest (its state belongs to the parent), only an exit status.
      int failures = 0;
      for (int round = 0; round < 2; ++round) {  // the second call finds the new workers
        Forward f(s, 300);
        failures += f.run(ctx) != FLASHATTN_SUCCESS || f.out != want.out;
      }
      Backward b(s, 301);
      failures += b.run(ctx) != FLASHATTN_SUCCESS || b.grads_untouched();
      std::vector<float> back(want.out.size());
      failures += flashattn_buffer_read(buf, 0, back.data(), back.size() * sizeof(float)) !=
                      FLASHATTN_SUCCESS ||
                  back != want.out;
      failures += flashattn_buffer_destroy(buf) != FLASHATTN_SUCCESS;
      failures += flashattn_context_set_num_threads(ctx, 2) != FLASHATTN_SUCCESS;
      Forward again(s, 300);
      failures += again.run(ctx) != FLASHATTN_SUCCESS || again.out != want.out;
      const flashattn_context_t inherited = ctx;
      failures += flashattn_context_destroy(inherited) != FLASHATTN_SUCCESS;
      _exit(failures == 0 ? 0 : 1);
    }
    const int status = wait_for_child(child, std::chrono::seconds(60));
    CHECK_MESSAGE(status != -1, "the child hung (waiting for worker threads only the parent has)");
    CHECK_MESSAGE(status == 0, "the child's calls failed or computed differently (status ", status,
                  ")");
    // The parent is unaffected.
    Forward f(s, 300);
    EXPECT_OK(f.run(ctx));
    CHECK(f.out == want.out);
    EXPECT_OK(flashattn_buffer_destroy(buf));
  }

  TEST_CASE("buffer_destroy is never refused, even while its context is busy") {
    Context ctx;
    constexpr size_t kBig = size_t(32) << 20;
    flashattn_buffer_t big = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&big, ctx, kBig));
    std::vector<unsigned char> src(kBig, 1);
    std::atomic<bool> stop{false};
    std::thread a([&] {
      for (int i = 0; i < 200 && !stop.load(); ++i) flashattn_buffer_write(big, 0, src.data(), kBig);
    });
    int refused = 0;
    for (int i = 0; i < 200; ++i) {
      flashattn_buffer_t b = nullptr;
      flashattn_status_t st;
      do {
        st = flashattn_buffer_create(&b, ctx, 128);
      } while (st == FLASHATTN_ERROR_CONTEXT_BUSY);
      if (st != FLASHATTN_SUCCESS) {
        ++refused;
        break;
      }
      if (flashattn_buffer_destroy(b) != FLASHATTN_SUCCESS) ++refused;
    }
    stop.store(true);
    a.join();
    CHECK(refused == 0);
    flashattn_buffer_destroy(big);
  }
}
