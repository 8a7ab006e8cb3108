// The caller's exchange function as the ring's transport, called synchronously: the context's
// work so far is finished first (on CUDA, its stream synchronized), and the work after it is
// enqueued once it returns.
#pragma once

#include <flashattn/flashattn.h>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/ring.hpp"

namespace flashattn {
namespace parallel {

class ExchangeTransport final : public RingTransport {
 public:
  ExchangeTransport(Backend& backend, flashattn_cp_exchange_fn exchange, void* user)
      : backend_(backend), exchange_(exchange), user_(user) {}

  int start(const void* send, void* recv, size_t bytes) override {
    backend_.synchronize();
    const int r = exchange_(user_, send, recv, bytes);
    if (r != 0) {
      fail(FLASHATTN_ERROR_DEVICE, "cp: the exchange function returned %d (sending %zu bytes)", r,
           bytes);
    }
    return 0;
  }
  void wait(int) override {}

 private:
  Backend& backend_;
  flashattn_cp_exchange_fn exchange_;
  void* user_;
};

}  // namespace parallel
}  // namespace flashattn
